"""Run directories: one run per directory (two real processes), a refused run touches nothing,
runs started together get their own, and the console/log file split (issue: nothing lost,
nothing confusing)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, TINY, python
from tests.plugin_dists import make_distribution

#: Always-on plugin (no conf/): when BARRIER is set, training waits in on_fit_start until that
#: file exists, so a test can act while the run holds its directory.
BARRIER = """
    import os
    import time
    from pathlib import Path

    from tuneup import hookimpl


    class Plugin:
        @hookimpl
        def on_fit_start(self):
            barrier = os.environ.get("BARRIER")
            if barrier:
                Path(barrier + ".pid").write_text(str(os.getpid()))
                os.replace(barrier + ".pid", barrier + ".waiting")
                while not Path(barrier).exists():
                    time.sleep(0.05)

        @hookimpl
        def on_train_batch_start(self, batch_idx):
            barrier = os.environ.get("STEP_BARRIER")  # the same, before the third step
            if barrier and batch_idx == 2:
                Path(barrier + ".pid").write_text(str(os.getpid()))
                os.replace(barrier + ".pid", barrier + ".waiting")
                while not Path(barrier).exists():
                    time.sleep(0.05)
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    return make_distribution(
        tmp_path_factory.mktemp("site"),
        "tuneup-barrier",
        {"tuneup_barrier": BARRIER},
        {"barrier": "tuneup_barrier:Plugin"},
    )


def start(site: Path, cwd: Path, *args: str, **environment) -> subprocess.Popen:
    """``run.py ARGS`` as a shell at a terminal starts it: with Ctrl-C's SIGINT at its default,
    also where this pytest runs as a background job (which starts with SIGINT ignored)."""
    env = {**os.environ, "PYTHONPATH": str(site), "PYTHONUNBUFFERED": "1", **environment}
    return subprocess.Popen(
        [*python(), str(ROOT / "run.py"), *TINY, *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def finish(process: subprocess.Popen, timeout: float = 300) -> tuple[str, str]:
    """(stdout, stderr) of the run once it ended; if it does not end in ``timeout`` seconds,
    it is killed and the test fails with what it printed and where its threads were."""
    try:
        return process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        tasks = Path(f"/proc/{process.pid}/task")
        where = (
            {t.name: (t / "wchan").read_text() for t in tasks.iterdir()} if tasks.exists() else {}
        )
        process.kill()
        out, err = process.communicate()
        pytest.fail(
            f"the run did not end in {timeout} s; threads waiting in {where}\n"
            f"stdout: {out[-3000:]}\nstderr: {err[-5000:]}"
        )


def wait_for(path: Path, process: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert process.poll() is None, process.communicate()[1][-3000:]
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.1)


def snapshot(run_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}


def assert_console_keeps_to_tuneup(out: str, err: str, log: str) -> None:
    """The console of a run that finished keeps to tuneup's lines; the log file keeps
    everything. Asserted on a run the test below makes anyway (its first), not a run of its own."""
    for line in ("tuneup: small_resnet on synthetic_images", "tuneup run summary"):
        assert line in out and line in log
    for noise in ("GPU available", "Tip:", "is deprecated", "not empty"):
        assert noise not in out + err, noise
    assert "GPU available" in log and "is deprecated" in log  # kept, in the file


def test_one_run_per_directory_and_a_refused_run_or_resume_touches_nothing(site, tmp_path):
    run_dir, barrier = tmp_path / "run", tmp_path / "go"
    first = start(
        site,
        tmp_path,
        f"hydra.run.dir={run_dir}",
        "checkpoint.every_n_steps=3",
        BARRIER=str(barrier),
    )
    wait_for(Path(f"{barrier}.waiting"), first)  # it holds the directory, training not begun
    holder = Path(f"{barrier}.waiting").read_text()  # the run's pid (first.pid under tests/warm.py)

    second = start(site, tmp_path, f"hydra.run.dir={run_dir}", "trainer.max_epochs=2")
    _, err = finish(second)
    assert second.returncode == 1, err[-3000:]
    assert f"error: run directory {run_dir} is in use by another run (process {holder} on " in err
    assert not (run_dir / "summary.json").exists()  # the first run's directory is untouched

    barrier.write_text("")
    out, err = finish(first)
    assert first.returncode == 0, err[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["epochs"] == 1  # not the second's 2 epochs
    assert_console_keeps_to_tuneup(out, err, (run_dir / "tuneup.log").read_text())
    leftover = run_dir / "checkpoints" / ".epoch000-step00000009.ckpt.tmp-1"  # a killed save's
    leftover.write_bytes(b"partial")
    before = snapshot(run_dir)

    refused = start(site, tmp_path, f"hydra.run.dir={run_dir}", "optimizer.lr=0.5")
    _, err = finish(refused)
    assert refused.returncode == 1 and "resume=null (start fresh) but" in err
    assert snapshot(run_dir) == before  # summary, .hydra/overrides.yaml, log: all as they were

    # A resume refused by a plugin's check (before the model is built), by the checkpoint's
    # weights (after it is built, its logger too), by the data order as training starts (step
    # 3, mid-epoch, on other data): the run's files byte for byte as they were, so that its
    # own command still continues it.
    resume = (f"hydra.run.dir={run_dir}", "resume=auto", "trainer.max_epochs=2")
    step_3 = run_dir / "checkpoints" / "epoch000-step00000003.ckpt"
    for change, said in [
        (["optimizer=schedulefree"], "scheduler=cosine cannot be used with "),
        (["model.width=16"], "model.width: 8 -> 16: the checkpoint's weights do not fit"),
        ([f"resume={step_3}", "data.train_samples=128"], "cannot resume mid-epoch"),
    ]:
        refused = start(site, tmp_path, *resume, *change)
        _, err = finish(refused)
        assert refused.returncode == 1 and said in err, err[-3000:]
        assert snapshot(run_dir) == before, change

    accepted = start(site, tmp_path, *resume)
    _, err = finish(accepted)
    assert accepted.returncode == 0, err[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["epochs"] == 2
    assert (run_dir / "metrics-1.csv").read_bytes() == before["metrics.csv"]
    assert not leftover.exists()  # removed once training started
    recorded = (run_dir / ".hydra" / "overrides.yaml").read_text()
    assert "schedulefree" not in recorded and "width=16" not in recorded


def test_runs_started_together_get_their_own_directories(site, tmp_path):
    runs = [
        start(
            site, tmp_path, "trainer.max_steps=1", "+trainer.limit_val_batches=0", "checkpoint=off"
        )
        for _ in range(2)
    ]
    for run in runs:
        _, err = finish(run)
        assert run.returncode == 0, err[-3000:]
    assert len(list((tmp_path / "outputs").glob("*/*/summary.json"))) == 2


def test_ctrl_c_is_an_interruption_not_a_failure(site, tmp_path):
    run_dir, barrier = tmp_path / "run", tmp_path / "go"
    run = start(site, tmp_path, f"hydra.run.dir={run_dir}", BARRIER=str(barrier))
    wait_for(Path(f"{barrier}.waiting"), run)
    run.send_signal(signal.SIGINT)
    finish(run)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted", summary.get("error")
    assert "resume=auto" in summary["error"]


def test_ctrl_c_saves_the_step_exits_130_and_says_how_to_continue(site, tmp_path):
    run_dir, barrier = tmp_path / "run", tmp_path / "go"
    run = start(site, tmp_path, f"hydra.run.dir={run_dir}", STEP_BARRIER=str(barrier))
    wait_for(Path(f"{barrier}.waiting"), run)  # in the third step
    run.send_signal(signal.SIGINT)
    barrier.write_text("")
    _, err = finish(run)
    assert run.returncode == 130, err[-3000:]
    (saved,) = (run_dir / "checkpoints").glob("*.ckpt")
    assert saved.name == "epoch000-step00000003.ckpt"  # the step it was in, finished and saved
    assert f"interrupted: Ctrl-C: stopped after step 3 and saved {saved}" in err
    assert f"resume=auto hydra.run.dir={run_dir}" in err and "Traceback" not in err
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["steps"] == 3


def test_a_second_ctrl_c_stops_at_once_without_saving(site, tmp_path):
    run_dir, barrier = tmp_path / "run", tmp_path / "go"
    run = start(site, tmp_path, f"hydra.run.dir={run_dir}", STEP_BARRIER=str(barrier))
    wait_for(Path(f"{barrier}.waiting"), run)
    run.send_signal(signal.SIGINT)
    time.sleep(0.5)  # the first is handled before the second arrives
    run.send_signal(signal.SIGINT)
    _, err = finish(run)
    assert run.returncode == 130, err[-3000:]
    assert not list((run_dir / "checkpoints").glob("*.ckpt"))
    assert "stopped at step 2 without saving" in err and "resume=auto" in err
    assert "Traceback" not in err


def test_a_run_directory_that_cannot_be_made_is_one_line(site, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    run = start(site, tmp_path, f"hydra.run.dir={blocker / 'run'}")
    _, err = finish(run)
    assert run.returncode == 1
    assert err.strip() == (
        f"error: cannot create the run directory {blocker / 'run'} (Not a "
        "directory); give one where you can write: hydra.run.dir=<directory>"
    )


@pytest.fixture
def mount(tmp_path):
    """``mount(options)``: a tmpfs of its own mounted with ``options`` (root only), unmounted
    after the test; skips where mounting is not allowed."""
    mounted = []

    def _mount(options: str) -> Path:
        point = tmp_path / f"mnt{len(mounted)}"
        point.mkdir()
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(point)], capture_output=True
        )
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
        mounted.append(point)
        return point

    yield _mount
    for point in mounted:
        subprocess.run(["umount", str(point)], check=False)


@pytest.mark.parametrize(
    ("options", "said"),
    [("ro", "cannot write in the run directory {} (Read-only file system)"),
     ("size=1m", "the run directory {} has less than 4 MiB free (No space left on device)")],
    ids=["read-only", "full"],
)  # fmt: skip
def test_a_read_only_or_full_run_directory_is_refused_before_training(mount, train, options, said):
    """Found at start, in one line naming the directory, not at the first save (up to
    checkpoint.every_n_minutes of training later)."""
    from tuneup import TuneupError

    run_dir = mount(options)
    with pytest.raises(TuneupError) as info:
        train(run_dir=run_dir)
    message = str(info.value)
    assert message.startswith(said.format(run_dir)) and "hydra.run.dir=<directory>" in message
    assert "\n" not in message and not list(run_dir.iterdir())  # nothing left behind
