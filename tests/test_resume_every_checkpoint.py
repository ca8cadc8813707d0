"""Resuming from any checkpoint a run wrote ends where the uninterrupted run ended.

For a few shapes of epoch and accumulation (accumulation that does not divide the epoch,
``max_steps`` or ``max_epochs`` as the limit, a limit that ends mid-epoch), one run writes a
checkpoint at many points: mid-epoch, at the end of each epoch (in ``on_train_epoch_end``,
and in ``on_train_batch_end`` of an epoch's last batch) and after validation
(``best.ckpt``). Each file, alone in a fresh run directory, is resumed with ``resume=auto``
(``best.ckpt`` with ``resume=<path>``): the resumed run must reach the same final step and
bit-for-bit the same weights, and say nothing is short. Before the fix, an end-of-epoch
checkpoint under ``max_steps`` resumed into a run that trained nothing and said ``ok``.

Also: "newest" is the furthest trained file, not the last modified one.
"""

from __future__ import annotations

import os
import shutil
import time

import pytest
import torch

from tests.conftest import compose_config
from tuneup import hookimpl
from tuneup.trainer import summary
from tuneup.trainer.runner import run
from tuneup.trainer.state.checkpoint_read import load
from tuneup.trainer.state.checkpoints import BEST, list_checkpoints, prune

#: 40 samples in batches of 4: 10 micro-batches per epoch. A tiny MLP: ~0.5 s a run.
BASE = [
    "model=mlp",
    "model.hidden=[8]",
    "data.image_size=8",
    "data.train_samples=40",
    "data.val_samples=8",
    "data.batch_size=4",
    "trainer.enable_progress_bar=false",
    "trainer.log_every_n_steps=1",
    "checkpoint.keep_last=null",
    "checkpoint.monitor=val/loss",
    "checkpoint.mode=min",
]

SHAPES = {
    # k=3 does not divide 10: steps of 3+3+3+1 micro-batches, 4 per epoch; max_steps set, so
    # Lightning trains "iteration-based" (the case that lost an epoch): step 4 ends epoch 0 in
    # on_train_epoch_end (every_n_steps=3).
    "max_steps, k=3": [
        "trainer.max_epochs=2", "trainer.max_steps=100", "grad_accum.steps=3",
        "checkpoint.every_n_steps=3",
    ],
    # 24 samples, 6 micro-batches per epoch: k=2 divides 6: step 6 ends epoch 1 inside
    # on_train_batch_end (every_n_steps=2), steps 3 and 9 in on_train_epoch_end.
    "max_epochs, k=2": [
        "data.train_samples=24", "trainer.max_epochs=3", "grad_accum.steps=2",
        "checkpoint.every_n_steps=2",
    ],
    # A step limit that ends mid-epoch (step 25 of 10 per epoch), by global_batch_size; steps
    # 10 and 20 end epochs inside on_train_batch_end (every_n_steps=5) under max_steps.
    "max_steps mid-epoch, global batch": [
        "trainer.max_epochs=5", "trainer.max_steps=25", "grad_accum.global_batch_size=4",
        "checkpoint.every_n_steps=5",
    ],
}  # fmt: skip
#: The k=3 shape over 3 epochs (12 steps), for the tests below that stop and resume it.
K3 = [*SHAPES["max_steps, k=3"], "trainer.max_epochs=3"]


def final(run_dir):
    newest = list_checkpoints(run_dir / "checkpoints")[0]
    return load(newest)


@pytest.mark.parametrize("shape", SHAPES)
def test_resume_from_every_checkpoint_reaches_the_same_step_and_weights(train, tmp_path, shape):
    overrides = [*BASE, *SHAPES[shape]]
    whole, whole_dir = train(*overrides, tiny=False, run_dir=tmp_path / "whole")
    expected = final(whole_dir)
    written = sorted((whole_dir / "checkpoints").glob("*.ckpt"))
    assert len(written) >= 5 and (whole_dir / "checkpoints" / BEST) in written

    for source in written:
        run_dir = tmp_path / f"from-{source.stem}"
        (run_dir / "checkpoints").mkdir(parents=True)
        if source.name == BEST:  # never a resume=auto candidate: named explicitly
            resume = f"resume={source}"
        else:
            shutil.copy(source, run_dir / "checkpoints" / source.name)
            resume = "resume=auto"
        where = f"resumed from {source.name}"
        at_end = load(source)["global_step"] == expected["global_step"]
        run(compose_config([*overrides, resume], tiny=False), run_dir=run_dir)
        if not (run_dir / "summary.json").exists():  # complete: nothing trained, nothing touched
            assert at_end, where
            continue
        assert not at_end or source.name == BEST, where  # the run's end must be left as it was
        resumed = summary.read(run_dir)
        assert resumed["status"] == "ok" and "short_of_limits" not in resumed, where
        assert resumed["steps"] == whole["steps"], where
        files = list_checkpoints(run_dir / "checkpoints")
        got = load(files[0]) if files else load(source)  # nothing left to train, nothing saved
        assert got["global_step"] == expected["global_step"], where
        for name, tensor in expected["state_dict"].items():
            assert torch.equal(got["state_dict"][name], tensor), f"{name} differs, {where}"


def make_times_backwards(paths):
    """What a copy can do: the furthest trained file gets the oldest time."""
    now = time.time()
    for age, path in enumerate(paths):  # paths newest first
        os.utime(path, (now - 100 + age, now - 100 + age))


def test_a_copied_run_resumes_and_prunes_by_progress_whatever_the_file_times(train, tmp_path):
    """``cp -r`` gives every file a new time, in no particular order. resume=auto and pruning
    go by the progress recorded in the files, so neither resumes nor keeps the step-3 file."""
    overrides = [*BASE, *K3]
    _, run_dir = train(*overrides, "trainer.max_steps=9", tiny=False, run_dir=tmp_path / "run")
    folder = run_dir / "checkpoints"
    files = list_checkpoints(folder)  # newest first
    assert [load(p)["global_step"] for p in files] == [9, 8, 6, 4, 3]
    make_times_backwards(files)

    resumed, _ = train(
        *overrides, "trainer.max_steps=10", "resume=auto", tiny=False, run_dir=run_dir
    )
    assert resumed["resumed_from"] == str(files[0])  # step 9, not step 3 (the newest time)
    assert resumed["steps"] == 10

    make_times_backwards(list_checkpoints(folder))
    deleted = prune(folder, keep=2)
    assert len(deleted) == 4
    assert [load(p)["global_step"] for p in list_checkpoints(folder)] == [10, 9]


def test_a_chain_of_resumes_across_epoch_ends_matches_one_run(train, tmp_path):
    """Each leg stops at a step limit (an epoch's end, mid-epoch, a window inside an epoch)
    and the next resumes the file it left: the progress a settled checkpoint gives Lightning
    must hold up for the resumes after it. A constant schedule, so the limit alone changes."""
    overrides = [*BASE, *K3, "scheduler=constant"]
    whole, whole_dir = train(
        *overrides, "trainer.max_steps=12", tiny=False, run_dir=tmp_path / "whole"
    )
    run_dir = tmp_path / "legs"
    train(*overrides, "trainer.max_steps=4", tiny=False, run_dir=run_dir)
    for limit in (6, 8, 9, 12):
        leg, _ = train(
            *overrides, f"trainer.max_steps={limit}", "resume=auto", tiny=False, run_dir=run_dir
        )
        assert leg["steps"] == limit and "short_of_limits" not in leg
    got, expected = final(run_dir), final(whole_dir)
    assert got["global_step"] == expected["global_step"] == whole["steps"] == 12
    for name, tensor in expected["state_dict"].items():
        assert torch.equal(got["state_dict"][name], tensor), name


class EpochInflater:
    """Fault injection: the checkpoint being resumed says one more epoch was done than was."""

    @hookimpl
    def on_load_checkpoint(self, checkpoint):
        for counts in checkpoint["loops"]["fit_loop"]["epoch_progress"].values():
            for key in counts:
                counts[key] += 1


def test_a_resumed_run_that_ends_short_of_its_limits_says_why(train, tmp_path, add_plugin):
    overrides = [*BASE, *K3]
    _, run_dir = train(*overrides, "trainer.max_steps=6", tiny=False, run_dir=tmp_path / "run")
    add_plugin(EpochInflater())
    resumed, _ = train(*overrides, "resume=auto", tiny=False, run_dir=run_dir)
    assert resumed["status"] == "ok" and resumed["steps"] == 8  # epoch 2 of 3 never trained
    assert resumed["short_of_limits"] == (
        "stopped after 8 of the 12 optimizer steps that trainer.max_epochs=3 x 4 steps per epoch "
        "ask for: the training loop counted 3 epochs done at step 8: the epochs and steps "
        "recorded in the checkpoint disagree with this run's steps per epoch (other data, batch "
        "size or accumulation?)"
    )
