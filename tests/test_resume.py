"""Exact resume, driven as a user drives it: ``python run.py`` killed, signalled, resumed.

Every resumed run must end with weights bit-for-bit equal to an uninterrupted
run's (CPU, fp32, same seed). The model has dropout, so the RNG states matter
too; 12 micro-batches per epoch, 3 epochs, a checkpoint every optimizer step
so that interruptions land mid-epoch. A test plugin (installed through an
entry point, only in the runs that are to be interrupted) kills or signals its
own process at an exact micro-batch, or inside a save.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import time

import pytest
import torch

from tests.conftest import ROOT, python, run_cli
from tests.plugin_dists import make_distribution
from tests.test_checkpoint_io import flip_tensor_bytes
from tuneup import TuneupError
from tuneup.trainer.state.checkpoint_read import UnreadableCheckpoint, UnsafeCheckpoint
from tuneup.trainer.state.checkpoint_read import load as load_checkpoint
from tuneup.trainer.state.checkpoints import checkpoint_name, list_checkpoints
from tuneup.trainer.state.preemption import EXIT_CODE
from tuneup.trainer.state.resume import resolve

RUN = [
    "model=gpt",
    "model.layers=1",
    "model.width=8",
    "model.dropout=0.1",
    "data=synthetic_tokens",
    "data.context=8",
    "data.train_samples=96",
    "data.val_samples=16",
    "data.batch_size=8",
    "trainer.max_epochs=3",
    "trainer.enable_progress_bar=false",
    "checkpoint.every_n_steps=1",
]
#: One thread everywhere: the same reduction order in every run, and no thread contention.
ONE_THREAD = {"OMP_NUM_THREADS": "1"}

CRASH = """
import os, signal
from tuneup import hookimpl
from tuneup.trainer.state import checkpoint_write

AT = int(os.environ.get("CRASH_AT_MICRO_BATCH", "0"))
SIGNAL = getattr(signal, os.environ.get("CRASH_SIGNAL", "SIGKILL"))
IN_SAVE_OF = os.environ.get("CRASH_IN_SAVE_OF")


class KillingOs:
    # os, except that renaming a finished temporary file onto IN_SAVE_OF kills the process first
    def __getattr__(self, name):
        return getattr(os, name)

    def replace(self, src, dst):
        if os.path.basename(dst) == IN_SAVE_OF:
            os.kill(os.getpid(), signal.SIGKILL)
        return os.replace(src, dst)


class Plugin:
    def __init__(self):
        self.micro_batches = 0
        if IN_SAVE_OF:
            checkpoint_write.os = KillingOs()

    @hookimpl
    def on_after_backward(self):  # gradients accumulated, optimizer step not yet taken
        self.micro_batches += 1
        if self.micro_batches == AT:
            os.kill(os.getpid(), SIGNAL)
"""


@pytest.fixture(scope="module")
def crash_site(tmp_path_factory):
    site = tmp_path_factory.mktemp("site")
    make_distribution(
        site, "tuneup-crash", {"tuneup_crash": CRASH}, {"crash": "tuneup_crash:Plugin"}
    )
    return site


def train(run_dir, *args, crash: dict | None = None, site=None):
    """``python run.py RUN ARGS`` in ``run_dir``; ``crash`` (env) loads the crash plugin."""
    env = {**ONE_THREAD, **(crash or {})}
    if crash:
        env["PYTHONPATH"] = str(site)
    return run_cli(f"hydra.run.dir={run_dir}", *RUN, *args, tiny=False, env=env)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """``reference(k)``: the run directory of an uninterrupted run with k-step accumulation."""
    runs = {}

    def run_dir(k: int):
        if k not in runs:
            path = tmp_path_factory.mktemp(f"reference-k{k}")
            result = train(path, f"grad_accum.steps={k}")
            assert result.returncode == 0, result.stderr[-3000:]
            runs[k] = path
        return runs[k]

    return run_dir


def final_weights(run_dir):
    newest = list_checkpoints(run_dir / "checkpoints")[0]
    return load_checkpoint(newest)["state_dict"]


def assert_bitwise_equal(run_dir, reference_dir):
    got, expected = final_weights(run_dir), final_weights(reference_dir)
    assert got.keys() == expected.keys()
    for name, value in expected.items():
        assert torch.equal(got[name], value), f"{name} differs from the uninterrupted run"


def summary(run_dir) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def resume_auto(run_dir, *args):
    result = train(run_dir, "resume=auto", *args)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


# -- kill -9 --------------------------------------------------------------------------------


def test_kill_9_during_a_save_in_epoch_2_loses_nothing_and_resumes_exactly(
    tmp_path, crash_site, reference
):
    """k=1: killed after the step-17 file was written but before it was renamed into place."""
    name = checkpoint_name(1, 17)
    result = train(tmp_path, crash={"CRASH_IN_SAVE_OF": name}, site=crash_site)
    assert result.returncode == -signal.SIGKILL, result.stderr[-3000:]
    folder = tmp_path / "checkpoints"
    assert not (folder / name).exists()  # no partial file under a final name
    assert list(folder.glob(f".{name}.tmp-*")), "the unfinished save's temporary file"
    newest = list_checkpoints(folder)[0]
    assert newest.name == checkpoint_name(1, 16) and load_checkpoint(newest)["state_dict"]

    resume_auto(tmp_path)
    assert summary(tmp_path)["resumed_from"].endswith(checkpoint_name(1, 16))
    assert not list(folder.glob(".*.tmp-*"))  # the leftover is cleaned up
    assert_bitwise_equal(tmp_path, reference(1))


def test_kill_9_inside_an_accumulation_window_in_epoch_2_resumes_exactly(
    tmp_path, crash_site, reference
):
    """k=3, 4 steps per epoch: micro-batch 20 is the 2nd of step 7's window (epoch 2).

    Resumed with the command the docs show after a hard crash, ``resume=auto
    hydra.run.dir=<run dir>`` alone: the run's recorded overrides (model=gpt,
    grad_accum.steps=3...) are taken, not the defaults. metrics.csv holds the killed
    session's rows up to the kill (Lightning's CSV logger held 100 rows in memory)."""
    import csv

    crash = {"CRASH_AT_MICRO_BATCH": "20", "CRASH_SIGNAL": "SIGKILL"}
    result = train(tmp_path, "grad_accum.steps=3", crash=crash, site=crash_site)
    assert result.returncode == -signal.SIGKILL, result.stderr[-3000:]
    assert list_checkpoints(tmp_path / "checkpoints")[0].name == checkpoint_name(1, 6)
    with open(tmp_path / "metrics.csv") as f:
        logged = [int(r["step"]) for r in csv.DictReader(f) if r.get("train/loss")]
    assert len(logged) == 6  # steps 1 to 6, every step (12 steps in the run)

    result = run_cli(f"hydra.run.dir={tmp_path}", "resume=auto", tiny=False, env=ONE_THREAD)
    assert result.returncode == 0, result.stderr[-3000:]
    record = tmp_path / ".hydra" / "overrides.yaml"
    assert f"resuming with this run's own settings from {record}: model=gpt " in result.stdout
    assert "grad_accum.steps=3" in result.stdout
    assert summary(tmp_path)["steps"] == 12
    assert_bitwise_equal(tmp_path, reference(3))


# -- preemption signals -----------------------------------------------------------------------


def test_sigterm_finishes_the_step_saves_and_exits_75_then_resumes_exactly(
    tmp_path, crash_site, reference
):
    """k=3: SIGTERM during micro-batch 17 (2nd of step 6's window): step 6 completes, is saved.
    Every step is logged, and each appears once in metrics-1.csv and metrics.csv together: the
    step saved at the signal is logged before the run stops (issue 43 point 19)."""
    crash = {"CRASH_AT_MICRO_BATCH": "17", "CRASH_SIGNAL": "SIGTERM"}
    every = "trainer.log_every_n_steps=1"
    result = train(tmp_path, "grad_accum.steps=3", every, crash=crash, site=crash_site)
    assert result.returncode == EXIT_CODE == 75, result.stderr[-3000:]
    assert "preempted: received SIGTERM: stopped after step 6" in result.stderr
    stopped = summary(tmp_path)
    assert stopped["status"] == "preempted" and stopped["micro_batches"] == 18
    assert list_checkpoints(tmp_path / "checkpoints")[0].name == checkpoint_name(1, 6)
    assert logged_steps(tmp_path / "metrics.csv") == list(range(1, 7))  # after 1..6 steps

    resume_auto(tmp_path, "grad_accum.steps=3", every)
    assert_bitwise_equal(tmp_path, reference(3))
    before, after = (logged_steps(tmp_path / name) for name in ("metrics-1.csv", "metrics.csv"))
    assert before + after == list(range(1, 13))  # 3 epochs x 4 steps, each once


def logged_steps(path) -> list[int]:
    """The steps of the rows of ``path`` (a metrics.csv) that log the training loss."""
    with open(path) as f:
        return [int(row["step"]) for row in csv.DictReader(f) if row.get("train/loss")]


def test_sigusr1_from_outside_saves_and_exits_75_then_resumes_exactly(tmp_path, reference):
    """k=1, as a scheduler does it: the signal comes from another process, at no chosen step."""
    command = [*python(), str(ROOT / "run.py"), f"hydra.run.dir={tmp_path}", *RUN]
    env = {**os.environ, **ONE_THREAD}
    process = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 120
    while not list((tmp_path / "checkpoints").glob("*.ckpt")) and time.monotonic() < deadline:
        time.sleep(0.01)
    process.send_signal(signal.SIGUSR1)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == EXIT_CODE, stderr[-3000:]
    assert "received SIGUSR1" in stderr
    stopped = list_checkpoints(tmp_path / "checkpoints")[0]
    assert summary(tmp_path)["steps"] == int(stopped.stem.split("step")[1]) < 36

    resume_auto(tmp_path)
    assert_bitwise_equal(tmp_path, reference(1))


# -- bad and unsafe files -----------------------------------------------------------------------


def copy_checkpoints(reference_dir, run_dir, steps):
    """Copies of the reference's checkpoints of ``steps`` (epoch 2), in that order of writing.

    Their times are set in the past: a file the test writes later is newer, whatever the
    granularity of the filesystem's clock."""
    folder = run_dir / "checkpoints"
    folder.mkdir(parents=True)
    copies = []
    for i, step in enumerate(steps):
        copy = folder / checkpoint_name(2, step)
        shutil.copy(reference_dir / "checkpoints" / copy.name, copy)
        written = time.time() - 100 + i
        os.utime(copy, (written, written))
        copies.append(copy)
    return copies


def truncate(path):
    path.write_bytes(path.read_bytes()[:1000])  # as a killed copy or a full disk leaves it


@pytest.mark.parametrize("damage", [truncate, flip_tensor_bytes], ids=["truncated", "4 bytes"])
def test_a_damaged_newest_checkpoint_is_named_and_the_previous_one_resumed(
    tmp_path, reference, damage
):
    """Also 4 bytes of tensor data overwritten in place (same size, a readable archive): the
    checksum written with the file catches it; before, the run resumed from it silently."""
    good, newest = copy_checkpoints(reference(1), tmp_path, [34, 35])
    damage(newest)
    with pytest.raises(UnreadableCheckpoint, match=newest.name):
        resolve(str(newest), tmp_path / "elsewhere")  # resume=<path>: refused, not skipped
    result = resume_auto(tmp_path)
    output = result.stdout + result.stderr
    assert "skipping a bad checkpoint" in output and newest.name in output
    assert summary(tmp_path)["resumed_from"] == str(good)
    assert good.exists()  # never deleted
    assert_bitwise_equal(tmp_path, reference(1))


class Payload:
    def __init__(self, path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def test_a_checkpoint_with_a_pickle_payload_is_refused_and_never_runs(tmp_path, reference):
    (good,) = copy_checkpoints(reference(1), tmp_path, [34])
    marker = tmp_path / "MARKER"
    evil = tmp_path / "checkpoints" / checkpoint_name(2, 35)
    state = torch.load(good, weights_only=True)
    torch.save({**state, "hyper_parameters": Payload(marker)}, evil)  # the newest file
    result = train(tmp_path, "resume=auto")
    assert result.returncode == 1
    assert f"error: {evil} holds a pickled Python object (posix.system)" in result.stderr
    assert "arbitrary code" in result.stderr
    with pytest.raises(UnsafeCheckpoint):
        resolve(str(evil), tmp_path)  # resume=<path>: the same refusal
    assert not marker.exists() and good.exists()


def test_config_read_back_from_a_checkpoint_is_data_never_instantiated(tmp_path, reference, train):
    (good,) = copy_checkpoints(reference(1), tmp_path / "run", [34])
    marker = tmp_path / "MARKER"
    state = torch.load(good, weights_only=True)
    target = {"_target_": "os.system", "_args_": [f"touch {marker}"]}
    state["tuneup_run"] = {**state["tuneup_run"], "precision": target, "seed": target}
    torch.save(state, good)
    summary_, _ = train(*RUN, "resume=auto", tiny=False)
    assert summary_["status"] == "ok" and not marker.exists()


# -- changed settings -----------------------------------------------------------------------


def test_changed_settings_are_listed_with_old_and_new_values(tmp_path, reference, train, caplog):
    copy_checkpoints(reference(1), tmp_path / "run", [34])
    train(*RUN, "resume=auto", "seed=1", "precision=bf16", tiny=False)
    assert "resuming" in caplog.text and "with changed settings" in caplog.text
    assert "precision.name: 'fp32' -> 'bf16': takes effect" in caplog.text
    assert "seed: 0 -> 1: no effect" in caplog.text


def test_another_dataset_size_mid_epoch_is_an_error(tmp_path, reference, train):
    """Another batch size or number of processes mid-epoch resumes (tests/test_elastic_resume.py);
    other data cannot continue the epoch's order."""
    copy_checkpoints(reference(1), tmp_path / "run", [34])  # 10 batches into epoch 2
    with pytest.raises(
        TuneupError,
        match="cannot resume mid-epoch: the checkpoint stopped 80 "
        "samples into epoch 2 of a dataset of 96 samples; this run has 48",
    ):
        train(*RUN, "resume=auto", "data.train_samples=48", tiny=False)
