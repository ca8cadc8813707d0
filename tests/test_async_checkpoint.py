"""checkpoint.async=true: the checkpoints written in the background are those a synchronous run
writes, byte for byte in their tensors; a kill -9 during a background write leaves no
checkpoint that verifies but is incomplete, and resume=auto continues exactly from the last
complete one; under strategy=fsdp (2 processes, gloo) every sharded checkpoint verifies and a
resume from one ends as the run that wrote it.

A test plugin slows the background writer (a sleep before each file is serialised), so
training goes on through the next optimizer step while a checkpoint is being written: a state
not copied before the step would be written with the step's changes.
"""

from __future__ import annotations

import json
import signal

import pytest
import torch

from tests.conftest import run_cli
from tests.plugin_dists import make_distribution
from tests.test_model_parallel import GPT, layout
from tests.test_resume import CRASH, ONE_THREAD
from tuneup.consolidate import consolidate
from tuneup.trainer.runner import ConfigError, run
from tuneup.trainer.state import sharded
from tuneup.trainer.state.async_save import BackgroundWriter
from tuneup.trainer.state.checkpoint_read import load, verify
from tuneup.trainer.state.checkpoints import checkpoint_name, list_checkpoints

#: 6 optimizer steps an epoch, 2 epochs, a checkpoint every step; the model has dropout, so
#: the RNG states in the checkpoint matter too.
RUN = [
    "model=gpt",
    "model.layers=1",
    "model.width=8",
    "model.dropout=0.1",
    "data=synthetic_tokens",
    "data.context=8",
    "data.train_samples=48",
    "data.val_samples=8",
    "data.batch_size=8",
    "trainer.max_epochs=2",
    "trainer.enable_progress_bar=false",
    "checkpoint.every_n_steps=1",
]

SLOW = """
import os, time
from tuneup.trainer.state import checkpoint_write

DELAY = float(os.environ.get("SLOW_SAVE_S", "0"))


class SlowTorch:
    # torch, except that save() sleeps first: the background writer falls behind training
    def __getattr__(self, name):
        return getattr(checkpoint_write.torch_module, name)

    def save(self, *args, **kwargs):
        time.sleep(DELAY)
        return checkpoint_write.torch_module.save(*args, **kwargs)


class Plugin:
    def __init__(self):
        if DELAY:
            checkpoint_write.torch_module = checkpoint_write.torch
            checkpoint_write.torch = SlowTorch()
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    site = tmp_path_factory.mktemp("site")
    modules = {"tuneup_crash": CRASH, "tuneup_slow": SLOW}
    plugins = {"crash": "tuneup_crash:Plugin", "slow": "tuneup_slow:Plugin"}
    return make_distribution(site, "tuneup-crash", modules, plugins)


def train(run_dir, *args, env: dict | None = None, site=None):
    env = {**ONE_THREAD, **(env or {}), **({"PYTHONPATH": str(site)} if site else {})}
    return run_cli(f"hydra.run.dir={run_dir}", *args, tiny=False, env=env)


def summary(run_dir) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def tensors(checkpoint: dict) -> dict:
    """The weights and the optimizer's state of a checkpoint, by a flat key."""
    found = {f"state_dict.{k}": v for k, v in checkpoint["state_dict"].items()}
    for i, opt in enumerate(checkpoint["optimizer_states"]):
        for param, state in opt["state"].items():
            found |= {
                f"optimizer_{i}.{param}.{k}": v for k, v in state.items() if torch.is_tensor(v)
            }
    return found


def assert_equal(got: dict, expected: dict, what: str) -> None:
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert torch.equal(got[key], value), f"{key} differs from {what}"


def test_a_bad_async_value_is_named(make_config, tmp_path):
    with pytest.raises(ConfigError) as info:
        run(make_config(["checkpoint.async=sometimes"]), run_dir=tmp_path)
    assert "checkpoint.async='sometimes'" in str(info.value) and "one of True, False" in str(
        info.value
    )


def test_a_failed_background_write_raises_where_training_waits_for_it():
    """Not silent: the error of a write in the background (a full disk) is raised by the next
    wait (the next save, the end of training); pruning queued behind it ran after it."""
    writer, done = BackgroundWriter(), []

    def write():
        done.append("write")
        raise OSError(28, "No space left on device")

    writer.submit(write)
    writer.then(done.append, "prune")
    with pytest.raises(OSError, match="No space left"):
        writer.wait()
    assert done == ["write", "prune"]
    writer.close()  # nothing left: the error was raised once


def test_kill_9_during_a_background_save_leaves_the_last_complete_one_and_resumes_exactly(
    tmp_path, site
):
    """keep_last=1: the step-8 checkpoint is deleted only once step 9's is complete; step 9's
    background write is killed just before its rename, while training has gone on."""
    sync = tmp_path / "sync"
    assert train(sync, *RUN, "checkpoint.keep_last=null").returncode == 0
    killed = tmp_path / "async"
    crash = {"CRASH_IN_SAVE_OF": checkpoint_name(1, 9), "SLOW_SAVE_S": "0.1"}
    args = [*RUN, "checkpoint.async=true", "checkpoint.keep_last=1"]
    result = train(killed, *args, env=crash, site=site)
    assert result.returncode == -signal.SIGKILL, result.stderr[-3000:]

    folder = killed / "checkpoints"
    assert [p.name for p in list_checkpoints(folder)] == [checkpoint_name(1, 8)]
    assert list(folder.glob(f".{checkpoint_name(1, 9)}.tmp-*")), "the unfinished write's file"
    verify(folder / checkpoint_name(1, 8))
    got = tensors(load(folder / checkpoint_name(1, 8)))
    assert_equal(got, tensors(load(sync / "checkpoints" / checkpoint_name(1, 8))), "a sync save")

    result = train(killed, *args, "resume=auto")
    assert result.returncode == 0, result.stderr[-3000:]
    done = summary(killed)
    assert done["resumed_from"].endswith(checkpoint_name(1, 8)) and done["steps"] == 12
    assert done["checkpoints"]["async"] is True and done["checkpoints"]["written"] == 4
    assert not list(folder.glob(".*"))  # the killed write's temporary file removed
    final = checkpoint_name(1, 12)
    assert [p.name for p in list_checkpoints(folder)] == [final]
    assert_equal(
        tensors(load(folder / final)),
        tensors(load(sync / "checkpoints" / final)),
        "the uninterrupted sync run",
    )


def test_sharded_async_checkpoints_verify_and_a_resume_ends_as_the_run(tmp_path):
    """strategy=fsdp, 2 processes: DCP's async_save on a gloo group of its own, then the
    manifest and rename in the background; 4 steps, every checkpoint kept."""
    args = [*GPT, *layout("fsdp"), "checkpoint.async=true", "checkpoint.keep_last=null"]
    first = tmp_path / "first"
    result = train(first, *args)
    assert result.returncode == 0, result.stderr[-3000:]
    saved = list_checkpoints(first / "checkpoints")
    assert [p.name[-13:] for p in saved] == [f"{s:08d}.ckpt" for s in (4, 3, 2, 1)]
    for path in saved:
        assert path.is_dir()
        sharded.verify(path)
    assert summary(first)["checkpoints"]["async"] is True

    again = tmp_path / "again"
    result = train(again, *args, f"resume={saved[2]}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert summary(again)["resumed_from"] == str(saved[2])
    ends = [
        consolidate(list_checkpoints(r / "checkpoints")[0], tmp_path / f"{r.name}.pt")
        for r in (again, first)
    ]
    assert_equal(ends[0], ends[1], "the run that wrote the checkpoint resumed")
