"""Checkpoints and the disk they live on: damaged files are set aside (never counted toward
keep_last, never deleted, named in the summary); a lowered keep_last frees its space before
the next save; a run that will not have room for its next checkpoint is warned at start."""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

import pytest
import torch

from tuneup import TuneupError
from tuneup.trainer.state import checkpoint_io, checkpoints
from tuneup.trainer.state.checkpoint_write import atomic_save, disk_full
from tuneup.trainer.state.checkpoints import checkpoint_files, checkpoint_name

#: 128 samples in batches of 32: 4 optimizer steps an epoch; about a second a run.
MLP = [
    "model=mlp",
    "model.hidden=[16]",
    "data.train_samples=128",
    "data.val_samples=32",
    "data.batch_size=32",
    "trainer.enable_progress_bar=false",
    "checkpoint.every_n_steps=1",
]


def names(run_dir) -> list[str]:
    return sorted(p.name for p in (run_dir / "checkpoints").glob("*.ckpt"))


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:1000])  # as a killed copy or a full disk leaves it


def flip_weight_bytes(path: Path) -> None:
    """4 bytes of a weight overwritten in place: the same size, still a readable archive."""
    weight = next(iter(torch.load(path, weights_only=True)["state_dict"].values()))
    raw = bytearray(path.read_bytes())
    at = raw.find(weight.numpy().tobytes()[:64])
    assert at > 0
    raw[at : at + 4] = bytes(b ^ 0xFF for b in raw[at : at + 4])
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("damage", [truncate, flip_weight_bytes], ids=["truncated", "4 bytes"])
def test_a_damaged_newest_checkpoint_is_set_aside_not_counted_nor_deleted(train, damage):
    _, run_dir = train(*MLP, "trainer.max_steps=4", "checkpoint.keep_last=3", tiny=False)
    newest = run_dir / "checkpoints" / checkpoint_name(0, 4)
    damage(newest)
    evidence = newest.read_bytes()
    summary, _ = train(
        *MLP,
        "trainer.max_steps=7",
        "checkpoint.keep_last=3",
        "resume=auto",
        tiny=False,
        run_dir=run_dir,
    )
    assert summary["status"] == "ok" and summary["resumed_from"].endswith(checkpoint_name(0, 3))
    # three good checkpoints kept (the damaged file held one of the slots before); the new
    # step-4 file did not overwrite it
    assert names(run_dir) == [checkpoint_name(1, s) for s in (5, 6, 7)]
    aside = run_dir / "checkpoints" / "damaged" / checkpoint_name(0, 4)
    assert aside.read_bytes() == evidence
    assert summary["checkpoints"]["damaged"] == [str(aside)]


def test_unreadable_files_are_set_aside_by_pruning_and_names_never_collide(tmp_path):
    folder = tmp_path / "checkpoints"
    for step in (1, 2, 3):
        atomic_save({"global_step": step}, folder / checkpoint_name(0, step))
    (folder / checkpoint_name(0, 9)).write_bytes(b"PK\x03\x04 half a zip")
    (folder / "damaged").mkdir()
    (folder / "damaged" / checkpoint_name(0, 9)).write_bytes(b"an earlier one")
    assert checkpoints.prune(folder, keep=2) == [folder / checkpoint_name(0, 1)]
    assert names(tmp_path) == [checkpoint_name(0, 2), checkpoint_name(0, 3)]
    assert sorted(p.name for p in checkpoints.damaged(folder)) == [
        "epoch000-step00000009-1.ckpt",
        checkpoint_name(0, 9),
    ]
    assert (folder / "damaged" / "epoch000-step00000009-1.ckpt").read_bytes().endswith(b"zip")


def room_for(files: int, monkeypatch) -> None:
    """A file system with room for ``files`` checkpoints: a save beyond that runs out of space."""
    real = checkpoint_io.atomic_save  # the name AtomicCheckpointIO saves with

    def save(checkpoint, path):
        if len(checkpoint_files(Path(path).parent)) >= files:
            full = OSError(errno.ENOSPC, "No space left on device")
            raise disk_full(Path(path), full)
        real(checkpoint, path)

    monkeypatch.setattr(checkpoint_io, "atomic_save", save)


def test_a_lowered_keep_last_frees_the_space_before_the_next_save(train, monkeypatch):
    _, run_dir = train(*MLP, "trainer.max_steps=3", "checkpoint.keep_last=3", tiny=False)
    room_for(3, monkeypatch)  # the three written: full
    with pytest.raises(
        TuneupError,
        match=r"no space left to save .*keep fewer \(resume=auto "
        r"checkpoint.keep_last=<fewer>",
    ):
        train(*MLP, "trainer.max_steps=5", "resume=auto", tiny=False, run_dir=run_dir)
    summary, _ = train(
        *MLP,
        "trainer.max_steps=5",
        "checkpoint.keep_last=1",
        "resume=auto",
        tiny=False,
        run_dir=run_dir,
    )  # as the message advises
    assert summary["status"] == "ok" and summary["steps"] == 5
    assert names(run_dir) == [checkpoint_name(1, 5)]


def test_a_run_without_room_for_its_next_checkpoint_is_warned_at_start(train, monkeypatch, caplog):
    usage = shutil.disk_usage("/")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage._replace(free=10_000))
    summary, run_dir = train(*MLP, "trainer.max_steps=2", tiny=False)
    assert summary["status"] == "ok"  # a warning: the saves here do fit after all
    assert (
        "only 0.0 MiB free on the file system of " + str(run_dir / "checkpoints")
    ) in caplog.text
    assert (
        "MiB (estimated: the weights and an optimizer state up to twice their size)" in caplog.text
    )
    caplog.clear()
    train(*MLP, "trainer.max_steps=3", "resume=auto", tiny=False, run_dir=run_dir)
    assert (
        f"MiB (the size of {checkpoint_name(0, 2)}): it will fail when it is written" in caplog.text
    )


def test_resuming_an_older_checkpoint_keeps_the_newer_ones_aside_and_says_so(train, caplog):
    """resume=<path> of step 2 in a directory holding steps 3 and 4: steps 3 and 4 are trained
    again; the old ones are moved into checkpoints/superseded/, byte for byte (before, the new
    step 3 replaced the old one without a word, and the old step 4 was newest for resume=auto
    until it was replaced too)."""
    _, run_dir = train(*MLP, "trainer.max_steps=4", tiny=False)
    folder = run_dir / "checkpoints"
    old = {step: (folder / checkpoint_name(0, step)).read_bytes() for step in (3, 4)}
    caplog.clear()
    summary, _ = train(
        *MLP,
        "trainer.max_steps=4",
        f"resume={folder / checkpoint_name(0, 2)}",
        tiny=False,
        run_dir=run_dir,
    )
    assert summary["status"] == "ok" and summary["steps"] == 4
    aside = folder / checkpoints.SUPERSEDED
    assert {step: (aside / checkpoint_name(0, step)).read_bytes() for step in (3, 4)} == old
    assert summary["checkpoints"]["superseded"] == [
        str(aside / checkpoint_name(0, s)) for s in (3, 4)
    ]
    assert names(run_dir) == [checkpoint_name(0, s) for s in (2, 3, 4)]  # the new 3 and 4
    assert (
        f"resuming {checkpoint_name(0, 2)}, older than 2 checkpoint(s) of this run (the "
        f"newest: {checkpoint_name(0, 4)}): moved them into {aside}"
    ) in caplog.text
