"""Against a real two-node Slurm on this host (tests/slurm/cluster.py): a 2-task DDP job
submitted through ``hydra/launcher=slurm`` that gets the preemption signal, is requeued and
resumes; an FSDP job of 2 nodes x 2 tasks; autotune's trials as Slurm jobs.

Skipped, with the reason, only where this machine cannot run Slurm (not root, or the Debian
packages are missing; .ci/run installs them).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, python
from tests.plugin_dists import make_distribution
from tests.slurm.cluster import running_cluster, unavailable

pytestmark = pytest.mark.slow

RUN = [
    "-m",
    "hydra/launcher=slurm",
    "hydra.launcher.cpus_per_task=1",
    "strategy=ddp",
    "trainer.devices=2",
    "trainer.accelerator=cpu",
    "model=mlp",
    "data.val_samples=64",
    "data.batch_size=16",
    "trainer.max_epochs=1",
    "trainer.enable_progress_bar=false",
    "resume=auto",
]


@pytest.fixture(scope="module")
def slurm():
    reason = unavailable()
    if reason:
        print(f"SKIP Slurm tests: {reason}")
        pytest.skip(reason)
    with running_cluster(nodes=2) as cluster:
        yield cluster


def submit(slurm, sweep: Path, *overrides: str, env=None, run=RUN) -> subprocess.Popen:
    """``run.py -m`` with the Slurm launcher, from ``sweep``'s parent: the job finds this
    checkout's packages on PYTHONPATH also where tuneup is not installed."""
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path]), **(env or {})}
    return subprocess.Popen(
        [*python(), str(ROOT / "run.py"), *run, f"hydra.sweep.dir={sweep}", *overrides],
        cwd=sweep.parent,
        env={**slurm.env, **env},
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def finish(process: subprocess.Popen, slurm, timeout: float = 400) -> str:
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        output, _ = process.communicate()
        pytest.fail(f"the sweep did not finish in {timeout} s:\n{output[-3000:]}\n{slurm.logs()}")
    assert process.returncode == 0, f"{output[-4000:]}\n{job_logs(process)}\n{slurm.logs()}"
    return output


def job_logs(process: subprocess.Popen) -> str:
    sweep = Path(next(a for a in process.args if a.startswith("hydra.sweep.dir=")).split("=", 1)[1])
    logs = sorted((sweep / ".submitit").rglob("*_log.*"))
    return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in logs)


SLOW_STEPS = """
import os, time
from pathlib import Path
from tuneup import hookimpl

class Plugin:
    @hookimpl
    def on_train_batch_end(self, trainer):
        if os.environ.get("SLURM_RESTART_COUNT", "0") == "0":  # the requeued run need not wait
            time.sleep(0.3)  # time to deliver the signal mid-run
        if trainer.global_rank == 0 and trainer.global_step >= 3:
            Path(os.environ["MARK_DIR"], "running").write_text(os.environ["SLURM_JOB_ID"])
"""


def test_a_two_task_ddp_job_gets_the_preemption_signal_is_requeued_and_resumes(slurm, tmp_path):
    """A 2-task DDP job through the launcher (one test, for both: each Slurm job costs two fresh
    interpreters) that gets Slurm's early-warning signal mid-run, saves, asks for a requeue,
    and finishes in the same directory from its checkpoint when Slurm runs it again."""
    site = make_distribution(
        tmp_path / "site",
        "tuneup-slow",
        {"slow_steps": SLOW_STEPS},
        {"slow_steps": "slow_steps:Plugin"},
    )
    marks = tmp_path / "marks"
    marks.mkdir()
    env = {"PYTHONPATH": os.pathsep.join([str(site), str(ROOT), *sys.path]), "MARK_DIR": str(marks)}
    sweep = tmp_path / "sweep"
    steps = 12
    # one epoch of 384 samples in 2 shards of batches of 16: 12 steps (24 if not sharded)
    process = submit(slurm, sweep, "data.train_samples=384", env=env)

    mark = marks / "running"
    deadline = time.monotonic() + 300
    while not mark.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert mark.exists(), f"the job never reached step 3\n{slurm.logs()}"
    job = mark.read_text()
    mark.unlink()
    slurm.run("scancel", "--signal=USR1", job)  # what Slurm sends signal_delay_s before the limit
    finish(process, slurm)

    run_dir = sweep / "0"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["steps"] == steps
    assert summary["world_size"] == 2 and summary["effective_batch_size"] == 2 * 16
    assert summary["plugins"]["strategy"]["cluster"] == "slurm"
    script = next((sweep / ".submitit").rglob("*_submission.sh")).read_text()
    assert "--ntasks-per-node=2" in script and "--signal=USR1@120" in script
    assert "resumed_from" in summary, "the requeued job started over instead of resuming"
    resumed_step = int(Path(summary["resumed_from"]).stem.split("step")[1])
    assert 3 <= resumed_step < steps
    assert [p.parent for p in tmp_path.rglob("summary.json")] == [run_dir]  # the same directory
    record = slurm.run("scontrol", "-o", "show", "job", job).stdout
    assert " Restarts=1 " in record, record  # Slurm ran the job a second time
    logs = job_logs(process)  # the hint is the command submitted, not submitit's _submit.py
    assert f"continue with: python {ROOT / 'run.py'} strategy" in logs
    assert "_submit.py strategy" not in logs


#: model=gpt (tests/test_model_parallel.py) on 2 nodes x 2 tasks: 2 steps of 4 x 4 samples.
FSDP = [
    "-m",
    "hydra/launcher=slurm",
    "hydra.launcher.cpus_per_task=1",
    "strategy=fsdp",
    "trainer.devices=2",
    "trainer.num_nodes=2",
    "trainer.accelerator=cpu",
    "model=gpt",
    "model.layers=2",
    "model.width=16",
    "model.heads=4",
    "data=synthetic_tokens",
    "data.context=8",
    "data.train_samples=32",
    "data.val_samples=16",
    "data.vocab_size=64",
    "data.batch_size=4",
    "trainer.max_epochs=1",
    "trainer.enable_progress_bar=false",
]


def test_an_fsdp_job_of_two_nodes_of_two_tasks_shards_over_all_four(slurm, tmp_path):
    """strategy=fsdp trainer.num_nodes=2 through the launcher (nodes and tasks per node from the
    trainer's settings, as docs/slurm.md says): one job on both nodes, its 4 ranks from Slurm,
    one mesh over them, a shard per rank in one checkpoint directory."""
    sweep = tmp_path / "sweep"
    finish(submit(slurm, sweep, run=FSDP), slurm)
    summary = json.loads((sweep / "0" / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["steps"] == 2
    assert summary["world_size"] == 4 and summary["effective_batch_size"] == 4 * 4
    assert [r["rank"] for r in summary["per_rank"]] == [0, 1, 2, 3]
    strategy = summary["plugins"]["strategy"]
    assert strategy["cluster"] == "slurm"
    assert strategy["mesh"] == {"data_parallel": 4, "tensor_parallel": 1}
    script = next((sweep / ".submitit").rglob("*_submission.sh")).read_text()
    assert "--nodes=2" in script and "--ntasks-per-node=2" in script
    (job,) = [p.name for p in (sweep / ".submitit").iterdir() if p.name.isdigit()]
    record = slurm.run("scontrol", "-o", "show", "job", job).stdout
    assert " NumNodes=2 " in record and " NumTasks=4 " in record, record
    placed = {  # submitit's line per task: JobEnvironment(..., node=1(2), global_rank=2(4))
        re.search(r"node=(\d)\(2\), global_rank=(\d)\(4\)", log.read_text()).groups()
        for log in (sweep / ".submitit" / job).glob("*_log.out")
    }
    assert placed == {("0", "0"), ("0", "1"), ("1", "2"), ("1", "3")}  # 2 ranks on each node
    (saved,) = (sweep / "0" / "checkpoints").iterdir()
    assert saved.is_dir()
    shards = sorted(p.name for p in saved.glob("*.distcp"))
    assert shards == [f"__{rank}_0.distcp" for rank in range(4)]


def test_autotune_launches_its_trials_as_slurm_jobs(slurm, tmp_path):
    """experiment=autotune under hydra/launcher=slurm: every trial a batch job of its own, the
    search decided from their summaries (channels_last made 3x faster by a test plugin)."""
    from tests.test_autotune import KNOWN_SPEEDS, ONE_DIMENSION

    site = make_distribution(
        tmp_path / "site",
        "known-speeds",
        {"known_speeds": KNOWN_SPEEDS},
        {"known_speeds": "known_speeds:Plugin"},
    )
    env = {"PYTHONPATH": os.pathsep.join([str(site), str(ROOT), *sys.path])}
    sweep = tmp_path / "sweep"
    process = subprocess.Popen(
        [
            *python(),
            str(ROOT / "run.py"),
            *ONE_DIMENSION,
            "hydra/launcher=slurm",
            "hydra.launcher.cpus_per_task=1",
            "trainer.accelerator=cpu",
            f"hydra.sweep.dir={sweep}",
        ],
        cwd=tmp_path,
        env={**slurm.env, **env},
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    finish(process, slurm)
    record = json.loads((sweep / "autotune.json").read_text())
    assert record["recipe"]["found"] == ["memory_format=channels_last"]
    jobs = {
        json.loads((sweep / t["job"] / "summary.json").read_text())["plugins"]["strategy"][
            "cluster"
        ]
        for t in record["trials"]
    }
    assert jobs == {"slurm"}  # every trial ran inside a Slurm job
    submitted = list((sweep / ".submitit").rglob("*_submission.sh"))
    assert len(submitted) == len(record["trials"]) >= 5
