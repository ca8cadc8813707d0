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

from tests.conftest import ROOT, python, tiny_gpt
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
    *tiny_gpt(epochs=1, batch_size=4),
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


#: A tiny time-to-target study: 16 steps of a small MLP, a target no run reaches (so no seed
#: is confirmed: the answer keeps the command), steps rank it, so no trial's time matters;
#: each job asks for a whole node (8 CPUs), so two at once take both.
STUDY = [
    "-m",
    "experiment=autotune",
    "autotune.objective=time_to_target",
    "autotune.stages=[study]",  # one study shared: its speed stage would run in each sweeper
    "autotune.workers=2",
    "autotune.budget_trials=4",
    "autotune.seeds=2",
    "autotune.max_seeds=2",
    "autotune.confirm=1",
    "autotune.max_rounds=2",
    "autotune.cost=steps",
    "autotune.budget_minutes=60",
    "autotune.params={optimizer.lr: 'tag(log, interval(2e-3, 0.3))'}",
    "hydra/launcher=slurm",
    "hydra.launcher.cpus_per_task=8",
    "trainer.accelerator=cpu",
    "data.train_samples=256",
    "data.val_samples=32",
    "data.batch_size=32",
    "model=mlp",
    "model.hidden=[8]",
    "trainer.max_steps=16",
    "trainer.max_epochs=-1",
    "target.metric=val/loss",
    "target.value=1e-9",
    "target.check_every_n_steps=4",
    "trainer.enable_progress_bar=false",
    "measure.console_table=false",
]


def test_two_sweepers_of_two_slurm_workers_share_one_journal_and_one_answers(slurm, tmp_path):
    """Two sweepers on one study (autotune.storage, a journal file on the shared file system):
    the first with autotune.workers=2, the second started once the first's baseline is in the
    study (it reuses it). Their trials are Slurm jobs on both nodes, two at a time; the study
    has budget_trials trials from both, no parameters repeated; exactly one sweeper writes the
    answer, the other names it and ends with rc 0."""
    import optuna

    journal = tmp_path / "shared" / "study.journal"
    storage = f"autotune.storage={journal}"
    first = submit(slurm, tmp_path / "a", storage, run=STUDY)
    # The cluster starts no new job from the baseline's start until the second sweeper has
    # asked for a trial: the first's two trials wait in the queue, so it cannot spend the
    # budget before the second joins, however fast the trials run.
    try:
        wait_for(lambda: "RUNNING" in slurm.run("squeue", "-h", "-o", "%T").stdout, first, 0.1)
        slurm.run("scontrol", "update", "PartitionName=debug", "State=DOWN")
        wait_for(lambda: stored_baseline(journal), first)
        second = submit(slurm, tmp_path / "b", storage, "autotune.workers=1", run=STUDY)
        wait_for(lambda: len(sweepers(journal)) == 2, second)
    finally:
        slurm.run("scontrol", "update", "PartitionName=debug", "State=UP")
    outputs = [finish(first, slurm, timeout=550), finish(second, slurm, timeout=550)]

    study = optuna.load_study(study_name="autotune", storage=journal_storage(journal))
    trials = [t for t in study.get_trials() if not t.user_attrs.get("tuneup_baseline")]
    done = [t for t in trials if t.state.name in ("COMPLETE", "PRUNED")]
    assert len(done) == 4, [(t.number, t.state.name) for t in trials]
    assert len({t.user_attrs["tuneup_sweeper"] for t in done}) == 2  # both sweepers' trials
    params = [t.params["optimizer.lr"] for t in done]
    assert len(set(params)) == len(params)  # no parameters repeat
    assert any(  # two trials in flight at once, as the storage has them
        a.datetime_start < b.datetime_complete and b.datetime_start < a.datetime_complete
        for i, a in enumerate(done)
        for b in done[i + 1 :]
    )
    jobs = [p.name for p in tmp_path.glob("*/.submitit/*") if p.name.split("_")[0].isdigit()]
    nodes = {
        re.search(r" NodeList=(\S+) ", slurm.run("scontrol", "-o", "show", "job", j).stdout)[1]
        for j in jobs
    }
    assert nodes == set(slurm.nodes), nodes  # the jobs ran on both nodes
    answered = [d for d in (tmp_path / "a", tmp_path / "b") if (d / "autotune.json").is_file()]
    assert len(answered) == 1 and (answered[0] / "autotune.md").is_file()
    assert len(list(tmp_path.rglob("recipe.yaml"))) == 1
    assert sum(o.count("autotune: the full run:") for o in outputs) == 1
    gave_way = outputs[answered[0].name == "a"]  # the other sweeper's output
    assert f"writes the answer of study 'autotune' into {answered[0]}" in gave_way
    other = tmp_path / ("b" if answered[0].name == "a" else "a")
    assert json.loads((other / "answered_by.json").read_text())["sweep_dir"] == str(answered[0])


def wait_for(condition, process: subprocess.Popen, every: float = 0.2, timeout: float = 300):
    """Polls ``condition`` until it holds, while ``process`` runs; fails after ``timeout``.
    Often: while the partition is down, the whole cluster waits for the test to notice."""
    deadline = time.monotonic() + timeout
    while not condition():
        if process.poll() is not None or time.monotonic() > deadline:
            output = process.communicate()[0] if process.poll() is not None else ""
            pytest.fail(f"waited for {condition} in vain:\n{output[-3000:]}")
        time.sleep(every)


def sweepers(journal: Path) -> set[str]:
    """The sweepers that have asked the study in ``journal`` for a trial."""
    import optuna

    study = optuna.load_study(study_name="autotune", storage=journal_storage(journal))
    return {
        t.user_attrs["tuneup_sweeper"]
        for t in study.get_trials()
        if "tuneup_sweeper" in t.user_attrs and not t.user_attrs.get("tuneup_baseline")
    }


def journal_storage(journal: Path):
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    return JournalStorage(JournalFileBackend(str(journal)))


def stored_baseline(journal: Path) -> bool:
    """Whether the study in ``journal`` has its baseline (the first sweeper's command, run)."""
    import optuna

    if not journal.is_file():
        return False
    try:
        study = optuna.load_study(study_name="autotune", storage=journal_storage(journal))
    except KeyError:  # not created yet
        return False
    return "tuneup_baseline" in study.user_attrs
