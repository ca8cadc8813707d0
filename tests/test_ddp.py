"""strategy=ddp on CPU (gloo, 2 processes): one run dir, the same weights as one big batch,
one all-reduce per optimizer step, sweeps, and a failing rank that ends the run in seconds."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import ROOT, compose_config, python, run_cli
from tests.plugin_dists import make_distribution
from tuneup.plugins.strategy import settings_problems
from tuneup.plugins.strategy.launch import config_options, job_command
from tuneup.trainer.environment import Environment

#: model=mlp (no BatchNorm: a batch's gradient does not depend on how it is split), tiny data.
MLP = [
    "model=mlp",
    "data.train_samples=256",
    "data.val_samples=64",
    "trainer.max_epochs=1",
    "trainer.enable_progress_bar=false",
    "trainer.log_every_n_steps=1",
    "trainer.accelerator=cpu",
]
DDP = ["strategy=ddp", "trainer.devices=2", "data.batch_size=16"]


def summary_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    (path,) = sorted((run_dir / "checkpoints").glob("epoch*.ckpt"))[-1:]
    return torch.load(path, map_location="cpu", weights_only=False)["state_dict"]


def relative_difference(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).norm() / b[k].norm()) for k in b)


def ddp_run(tmp_path: Path, *overrides: str, name: str = "ddp", env: dict | None = None):
    run_dir = tmp_path / name
    result = run_cli(
        *MLP, *DDP, f"hydra.run.dir={run_dir}", *overrides, cwd=tmp_path, tiny=False, env=env
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("tuneup: mlp on") == 1  # the start-up line once, not per process
    return run_dir


# -- end to end: two processes ---------------------------------------------------------------


@pytest.mark.cold  # both ranks from fresh interpreters, as a user's pair starts
@pytest.mark.slow
def test_ddp_equals_one_process_on_the_whole_batch(tmp_path, train):
    """2 micro-batches a step: the first under no_sync, the last all-reduced as every
    micro-batch is without accumulation, so this one case covers both (a case without
    accumulation was a second pair of processes, this file's main cost)."""
    steps, accumulate = 3, 2
    common = [f"trainer.max_steps={steps}", f"grad_accum.steps={accumulate}"]
    run_dir = ddp_run(tmp_path, *common, "strategy.count_allreduces=true")

    summary = summary_of(run_dir)
    assert summary["status"] == "ok" and summary["world_size"] == 2
    assert summary["steps"] == steps and summary["samples_per_s"] > 0
    assert summary["samples"] == steps * accumulate * 32  # both ranks' samples: the aggregate
    assert summary["plugins"]["strategy"]["backend"] == "gloo"
    # One run directory, one summary: rank 1 wrote into rank 0's directory and no summary.
    assert [p.parent for p in tmp_path.rglob("summary.json")] == [run_dir]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ddp"]
    # No wasted communication: one gradient all-reduce per optimizer step, none on the
    # micro-batches accumulated under no_sync.
    assert summary["micro_batches"] == steps * accumulate
    assert summary["gradient_allreduces"] == steps

    reference = {}
    for batch in (32, 16):  # 16: a different batch must give different weights
        _, one = train(
            *MLP, f"data.batch_size={batch}", *common, tiny=False, run_dir=tmp_path / f"one{batch}"
        )
        reference[batch] = final_weights(one)
    ddp = final_weights(run_dir)
    assert relative_difference(ddp, reference[32]) < 1e-5
    assert relative_difference(ddp, reference[16]) > 1e-3


@pytest.mark.slow
def test_fp16_gradient_compression_runs_on_cpu_and_a_rank_joining_late_joins(tmp_path, train):
    """Two promises, one pair of processes (a pair costs 10 CPU-seconds): fp16 compression, and
    joining has its own timeout (strategy.join_timeout_s, 30 min): a rank that reaches the
    rendezvous 9 s after rank 0 joins under strategy.timeout_s=6, which bounds collectives
    only (on main the one timeout bounded both: DistStoreError, 1/2 clients joined). Both
    processes sleep meanwhile, a core idle: 6 s is as low as the collectives' timeout goes on
    a loaded 2-core machine without the risk of a rank descheduled that long."""
    steps = 3
    env, pids = slow_start(tmp_path, 9)
    run_dir = ddp_run(
        tmp_path,
        f"trainer.max_steps={steps}",
        "strategy.comm_hook=fp16",
        "strategy.count_allreduces=true",
        "strategy.timeout_s=6",
        env=env,
    )
    assert (pids / "joining1").exists()  # rank 1 did sleep before joining
    summary = summary_of(run_dir)
    assert summary["plugins"]["strategy"]["comm_hook"] == "fp16"
    assert summary["gradient_allreduces"] == steps  # the hook is registered on CPU too
    _, one = train(
        *MLP,
        "data.batch_size=32",
        f"trainer.max_steps={steps}",
        tiny=False,
        run_dir=tmp_path / "one",
    )
    difference = relative_difference(final_weights(run_dir), final_weights(one))
    assert 0 < difference < 1e-2  # half-precision gradients: close, not equal


# A sweep of DDP jobs, each with its rank 1 in its own directory: tests/test_sweeps.py
# (test_a_sweep_of_a_ddp_and_an_fsdp_job_runs_each_on_two_ranks_in_its_own_directory).


FAILING_PLUGIN = """
import os
from pathlib import Path
from tuneup import hookimpl

class Plugin:
    @hookimpl
    def on_train_batch_start(self, trainer):
        Path(os.environ["PIDS_DIR"], str(trainer.global_rank)).write_text(str(os.getpid()))
        if trainer.global_rank == 1 and trainer.global_step == 3:
            raise RuntimeError("rank one fails on purpose")
"""


@pytest.mark.slow
def test_a_failing_rank_ends_every_process_in_seconds(tmp_path):
    site = make_distribution(
        tmp_path / "site",
        "tuneup-fail",
        {"fail_rank": FAILING_PLUGIN},
        {"fail_rank": "fail_rank:Plugin"},
    )
    pids = tmp_path / "pids"
    pids.mkdir()
    env = {"PYTHONPATH": os.pathsep.join([str(site), *sys.path]), "PIDS_DIR": str(pids)}
    started = time.monotonic()
    result = run_cli(
        *MLP,
        *DDP,
        f"hydra.run.dir={tmp_path / 'run'}",
        cwd=tmp_path,
        env=env,
        tiny=False,
        timeout=300,
    )
    elapsed = time.monotonic() - started
    assert result.returncode != 0
    assert "rank 1: plugin 'fail_rank' failed" in result.stderr
    assert "rank one fails on purpose" in result.stderr
    assert elapsed < 90, "ended by a collective timeout, not by the failure"  # default: 30 min
    ranks = {p.name: int(p.read_text()) for p in pids.iterdir()}
    assert sorted(ranks) == ["0", "1"]
    deadline = time.monotonic() + 15
    while any(_alive(pid) for pid in ranks.values()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [rank for rank, pid in ranks.items() if _alive(pid)]


SLOW_START_PLUGIN = """
import os
import time
from pathlib import Path
from tuneup import hookimpl

class Plugin:
    def __init__(self):  # as early as a plugin gets: the run's plugins are being made
        rank = os.environ.get("LOCAL_RANK", "0")  # set by the launcher in the ranks it starts
        Path(os.environ["PIDS_DIR"], rank).write_text(str(os.getpid()))

    @hookimpl
    def configure_trainer(self):
        rank = os.environ.get("LOCAL_RANK", "0")
        if rank != "0":  # a rank still importing on a loaded machine: joins this much later
            time.sleep(float(os.environ["SLOW_START_S"]))
            Path(os.environ["PIDS_DIR"], f"joining{rank}").write_text("")
"""


def slow_start(tmp_path: Path, slow_s: float) -> tuple[dict, Path]:
    """The environment of a 2-process run whose rank 1 reaches the rendezvous ``slow_s`` seconds
    after rank 0, and the folder where each rank writes its pid."""
    site = make_distribution(
        tmp_path / "site",
        "tuneup-slow",
        {"slow_start": SLOW_START_PLUGIN},
        {"slow_start": "slow_start:Plugin"},
    )
    pids = tmp_path / "pids"
    pids.mkdir()
    env = {
        "PYTHONPATH": os.pathsep.join([str(site), *sys.path]),
        "PIDS_DIR": str(pids),
        "SLOW_START_S": str(slow_s),
    }
    return env, pids


@pytest.mark.slow
def test_a_rank_that_does_not_join_in_time_fails_the_run_naming_the_setting_and_dies(tmp_path):
    env, pids = slow_start(tmp_path, 120)
    result = run_cli(
        *MLP,
        "trainer.devices=2",
        "strategy=fsdp",
        "strategy.join_timeout_s=1",
        f"hydra.run.dir={tmp_path / 'run'}",
        cwd=tmp_path,
        env=env,
        tiny=False,
    )
    assert result.returncode == 1
    (line,) = [x for x in result.stderr.splitlines() if x.startswith("error:")]
    assert line.startswith(
        "error: rank 0: 1 of 2 processes joined within strategy.join_timeout_s=1 s"
    )
    assert "Raise strategy.join_timeout_s" in line
    # Rank 1 was killed asleep (or, on a loaded machine, before it got as far as writing its
    # pid): alive, it would write its pid in a moment and go on to join.
    late = pids / "1"
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and not (late.exists() and not _alive(int(late.read_text()))):
        time.sleep(0.2)
    assert not (late.exists() and _alive(int(late.read_text()))), "rank 1 outlived the failed run"
    assert not (pids / "joining1").exists()  # it never went on to join


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "Z" not in _state(pid)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return "Z"


# -- checks and pieces, in this process -------------------------------------------------------


def problems_for(*overrides):
    cfg = compose_config([*MLP, *overrides], tiny=False)
    return settings_problems(cfg, Environment.from_config(cfg))


@pytest.mark.slow
def test_a_rank_still_starting_ends_with_a_rank_0_that_was_killed(tmp_path):
    """kill -9 (or the OOM killer) of rank 0 while rank 1 is still starting: rank 1 is ended by
    the kernel with it (PR_SET_PDEATHSIG), instead of retrying to reach it for
    strategy.join_timeout_s. On main it lived on, orphaned."""
    env, pids = slow_start(tmp_path, 120)
    command = [*python(), str(ROOT / "run.py"), *MLP, *DDP, f"hydra.run.dir={tmp_path / 'run'}"]
    run = subprocess.Popen(
        command,
        cwd=tmp_path,
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    late = pids / "1"
    try:
        deadline = time.monotonic() + 240
        while not late.exists() and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert late.exists(), "rank 1 did not start"
        os.kill(int((pids / "0").read_text()), signal.SIGKILL)  # rank 0, waiting for rank 1
        run.wait(timeout=60)
        deadline = time.monotonic() + 15
        while _alive(int(late.read_text())) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(int(late.read_text())), "rank 1 outlived rank 0"
    finally:
        if late.exists() and _alive(int(late.read_text())):
            os.kill(int(late.read_text()), signal.SIGKILL)


def test_a_rank_that_cannot_reach_rank_0_in_time_names_the_setting_too():
    """What a process of another node says when rank 0 never came up (torch's client error)."""
    from tuneup.plugins.strategy.join import not_joined

    torch_said = (
        "The client socket has timed out after 600000ms while trying to connect to "
        "(10.0.0.1, 29500).\nException raised from throwTimeoutError"
    )
    line = not_joined(torch_said, 3, 4, 600)
    assert line.startswith(
        "process 3 of 4 could not reach rank 0 within "
        "strategy.join_timeout_s=600 s: rank 0 did not start or has ended "
        "(The client socket has timed out"
    )
    assert "\n" not in line and "Raise strategy.join_timeout_s" in line


def test_ddp_with_one_process_given_explicitly_is_a_problem():
    (found,) = problems_for("strategy=ddp", "trainer.devices=1")
    assert "one process" in found and "trainer.devices=2" in found


def test_ddp_with_devices_auto_on_one_device_runs_one_process_and_says_so(train):
    summary, _ = train("strategy=ddp", "trainer.accelerator=cpu", "trainer.max_steps=2")
    strategy = summary["plugins"]["strategy"]
    assert summary["status"] == "ok" and summary["world_size"] == 1
    assert strategy["used"] == "single process"
    assert strategy["note"].startswith("strategy=ddp with trainer.devices=auto on cpu: one device")


def test_bad_strategy_settings_are_named():
    found = problems_for(
        "strategy=ddp",
        "trainer.devices=2",
        "strategy.comm_hook=int8",
        "+strategy.nonsense=1",
        "strategy.timeout_s=0",
    )
    text = "\n".join(found)
    assert "strategy.comm_hook='int8' is not allowed" in text
    assert "strategy.nonsense is not a setting of strategy=ddp" in text
    assert "strategy.timeout_s=0" in text


def test_slurm_tasks_must_match_devices(monkeypatch):
    monkeypatch.setenv("SLURM_NTASKS", "4")
    monkeypatch.setenv("SLURM_JOB_NAME", "train")
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "4")
    monkeypatch.setenv("SLURM_NNODES", "1")
    found = problems_for("strategy=ddp", "trainer.devices=2")
    assert any("runs 4 task(s) per node" in p and "trainer.devices=4" in p for p in found)


def test_child_command_runs_the_job_not_the_sweep():
    command = job_command(
        ["python", "/src/run.py"],
        ["-m", "-cn", "config", "optimizer.lr=0.1,0.01", "strategy=ddp"],
        ["optimizer.lr=0.01", "strategy=ddp"],
        [
            "hydra.mode=MULTIRUN",
            "hydra.sweep.dir=/s",
            "hydra/launcher=slurm",
            "hydra.job.chdir=true",
        ],
        "/s/1",
        local_rank=1,
    )
    assert command == [
        "python",
        "/src/run.py",
        "-cn",
        "config",
        "optimizer.lr=0.01",
        "strategy=ddp",
        "hydra.job.chdir=true",
        'hydra.run.dir="/s/1"',
        "hydra.job.name=train_ddp_process_1",
        "hydra.output_subdir=null",
    ]
    assert config_options(["--config-dir=/c", "a=1", "-cp", "p"]) == ["--config-dir=/c", "-cp", "p"]
