"""Sweeps as users run them (``python run.py -m ...``): the report at the end, failed runs, joblib."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from tests.conftest import ROOT, run_cli, tiny_gpt
from tests.report_tables import (
    assert_row_matches,
    best_line,
    number,
    png_size,
    read_table,
    run_name,
)

pytestmark = pytest.mark.slow

#: A run of a few steps on 8x8 images: 4 micro-batches of 16, the last 2 measured.
SMALL = [
    "data.train_samples=64",
    "data.val_samples=32",
    "data.image_size=8",
    "model.width=4",
    "trainer.max_epochs=1",
    "trainer.enable_progress_bar=false",
]


def sweep(tmp_path, *args):
    """Run ``python run.py -m ARGS`` with the sweep directory tmp_path/sweep."""
    sweep_dir = tmp_path / "sweep"
    done = run_cli("-m", f"hydra.sweep.dir={sweep_dir}", *args, cwd=tmp_path, tiny=False)
    return done, sweep_dir


def overrides(run_dir) -> list[str]:
    return list(OmegaConf.load(run_dir / ".hydra" / "overrides.yaml"))


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    """A 2x2 grid sweep through the joblib launcher, 2 jobs at a time, with the threads joblib
    gives (no OMP_NUM_THREADS): one sweep for the report's test and the launcher's."""
    tmp_path = tmp_path_factory.mktemp("grid")
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("OMP_NUM_THREADS", raising=False)  # joblib then sets cores // n_jobs
        done, sweep_dir = sweep(
            tmp_path,
            *SMALL,
            "data.batch_size=16",
            "trainer.accelerator=cpu",  # threads are a CPU run's figure (the device name says them)
            "hydra/launcher=joblib",
            "hydra.launcher.n_jobs=2",
            "precision=fp32,bf16",
            "memory_format=contiguous,channels_last",
        )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return sweep_dir, (sweep_dir / "report.md").read_text()


def test_grid_sweep_ends_with_a_report_that_matches_every_run(grid):
    sweep_dir, markdown = grid
    rows = read_table(markdown)
    assert sorted(run_name(r) for r in rows) == ["0", "1", "2", "3"]
    for row in rows:
        run_dir = sweep_dir / run_name(row)
        assert_row_matches(row, run_dir, sweep_dir / "0")
        windows = json.loads((run_dir / "summary.json").read_text())["samples_per_s_windows"]
        assert row["spread"] == f"{min(windows):.1f}-{max(windows):.1f}"  # its speed windows
        swept = [o for o in overrides(run_dir) if o.startswith(("precision=", "memory_format="))]
        assert row["overrides"] == f"`{' '.join(swept)}`"
    speeds = [number(r["samples/s"]) for r in rows]
    assert speeds == sorted(speeds, reverse=True)
    baseline = next(r for r in rows if "baseline" in r["run"])
    assert (run_name(baseline), baseline["speed-up"]) == ("0", "1.00x")
    best = run_name(next(r for r in rows if "best" in r["run"]))
    command = " ".join(["python", str(ROOT / "run.py"), *overrides(sweep_dir / best)])  # as run
    assert best_line(markdown).endswith(f"reproduce: `{command}`")
    assert png_size(sweep_dir / "report.png") == (1400, 600)

    # The same report from the directory after the fact.
    (sweep_dir / "report.md").unlink()
    again = run_cli_report(sweep_dir)
    assert again.returncode == 0, again.stderr
    assert (sweep_dir / "report.md").read_text() == markdown


@pytest.mark.cold  # the sweep from a fresh interpreter, as a user starts it
def test_a_failed_run_is_reported_and_the_sweep_exits_1(tmp_path):
    # Job 0 fails at its first step (batch size 1 on 4x4 images: BatchNorm sees one value per
    # channel, a runtime error, not a config error); job 1 must still run.
    done, sweep_dir = sweep(
        tmp_path, *SMALL, "data.image_size=4", "data.batch_size=1,16", "report.baseline=1"
    )
    assert done.returncode == 1
    assert "1 of 2 runs did not finish" in done.stdout + done.stderr
    rows = {run_name(r): r for r in read_table((sweep_dir / "report.md").read_text())}
    failed = json.loads((sweep_dir / "0" / "summary.json").read_text())
    assert failed["status"] == "failed"
    assert rows["0"]["status"] == f"failed: {failed['error'].splitlines()[-1]}"
    assert "Expected more than 1 value per channel" in rows["0"]["status"]
    assert "Traceback" in (sweep_dir / "0" / "tuneup.log").read_text()
    assert rows["1"]["status"] == "ok"
    assert rows["1"]["run"] == "1 (baseline, best)"
    assert_row_matches(rows["1"], sweep_dir / "1", sweep_dir / "1")


def test_joblib_launcher_runs_jobs_in_parallel_with_threads_split(request):
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    joblib = pytest.importorskip("joblib")
    sweep_dir, markdown = request.getfixturevalue("grid")  # the sweep runs through joblib
    threads = max(joblib.cpu_count() // 2, 1)
    for job in ("0", "1", "2", "3"):
        summary = json.loads((sweep_dir / job / "summary.json").read_text())
        assert summary["status"] == "ok"
        assert summary["device"].endswith(f", {threads} threads)")
    rows = read_table(markdown)
    assert sorted(run_name(r) for r in rows) == ["0", "1", "2", "3"]
    for row in rows:
        assert_row_matches(row, sweep_dir / run_name(row), sweep_dir / "0")
    assert "ran in parallel (hydra.launcher.n_jobs=2)" in markdown


def run_cli_report(directory):
    return subprocess.run(
        [sys.executable, "-m", "tuneup.report", str(directory)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


#: model=gpt, 2 steps of a global batch of 16 on 2 ranks (tests/test_model_parallel.py); the
#: strategy (ddp or fsdp) given by the sweep.
FSDP = [
    *tiny_gpt(epochs=1, batch_size=8),
    "trainer.enable_progress_bar=false",
    "trainer.accelerator=cpu",
    "trainer.devices=2",
]


def test_a_sweep_of_a_ddp_and_an_fsdp_job_runs_each_on_two_ranks_in_its_own_directory(tmp_path):
    """Lightning's children under Hydra's multirun (plugins/strategy/launch.py), for DDP and for
    FSDP in one sweep (it was a sweep each): each job starts its own rank 1 (job 1 once found
    job 0's LOCAL_RANK, started none and broadcast to a peer that had exited), which runs in
    that job's directory and joins that job, not a new sweep."""
    done, sweep_dir = sweep(tmp_path, *FSDP, "strategy=ddp,fsdp")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert sorted(p.parent.name for p in tmp_path.rglob("summary.json")) == ["0", "1"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sweep"]  # no outputs/, no 2nd sweep
    for job, strategy in (("0", "ddp"), ("1", "fsdp")):
        run_dir = sweep_dir / job
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["status"] == "ok" and summary["world_size"] == 2 and summary["steps"] == 2
        assert [r["rank"] for r in summary["per_rank"]] == [0, 1]
        assert f"strategy={strategy}" in overrides(run_dir)
        assert (run_dir / "tuneup.rank0-1.log").exists()  # rank 1 ran in this job's directory
        (saved,) = (run_dir / "checkpoints").iterdir()
        if strategy == "ddp":
            assert saved.is_file() and saved.suffix == ".ckpt"  # one file, from rank 0
            continue
        assert summary["plugins"]["strategy"]["mesh"] == {"data_parallel": 2, "tensor_parallel": 1}
        shards = sorted(p.name for p in saved.glob("*.distcp"))  # sharded: a shard per rank
        assert shards == ["__0_0.distcp", "__1_0.distcp"]
    rows = read_table((sweep_dir / "report.md").read_text())
    assert sorted(run_name(r) for r in rows) == ["0", "1"]
