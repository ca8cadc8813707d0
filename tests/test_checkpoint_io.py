"""The parts of checkpointing that need no training run: files, data order, RNG states, NaN watch."""

from __future__ import annotations

import errno
import hashlib
import math
import os
import random
import struct
import time
import zipfile

import numpy as np
import pytest
import torch

from tuneup import TuneupError
from tuneup.trainer.state import checkpoint_io, checkpoint_write, rng, sharded
from tuneup.trainer.state.checkpoint_read import UnreadableCheckpoint, UnsafeCheckpoint, load
from tuneup.trainer.state.checkpoint_write import atomic_save
from tuneup.trainer.state.checkpoints import (
    BEST,
    checkpoint_name,
    list_checkpoints,
    newest_valid,
    prune,
)
from tuneup.trainer.state.data_order import ResumableLoader, ResumableSampler
from tuneup.trainer.state.divergence import Diverged, LossWatch, nonfinite_tensors


class Exploding:
    """Pickling it fails half-way through a torch.save: a crash during a save."""

    def __reduce__(self):
        raise RuntimeError("disk on fire")


class Payload:
    """Unpickling it would create ``path``: what a malicious checkpoint does."""

    def __init__(self, path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def write(directory, name, value=1.0, age=0.0, step=0):
    """A checkpoint at optimizer step ``step``, its file time ``age`` seconds ago."""
    path = directory / name
    atomic_save({"w": torch.full((3,), value), "global_step": step}, path)
    stamp = time.time() - age
    os.utime(path, (stamp, stamp))
    return path


def flip_tensor_bytes(path, count=4):
    """Overwrite ``count`` bytes of the first tensor's data in place: the size stays, the zip
    stays readable, torch.load reads other numbers. What a bad disk or a bad copy does."""
    with zipfile.ZipFile(path) as archive:
        member = next(i for i in archive.infolist() if "/data/" in i.filename)
    with open(path, "r+b") as f:
        f.seek(member.header_offset + 26)
        name_length, extra_length = struct.unpack("<HH", f.read(4))
        start = member.header_offset + 30 + name_length + extra_length
        f.seek(start)
        data = f.read(count)
        f.seek(start)
        f.write(bytes(b ^ 0xFF for b in data))


# -- atomic writes ------------------------------------------------------------------------


def test_a_save_that_fails_midway_leaves_the_previous_file_and_no_partial_one(tmp_path):
    path = tmp_path / checkpoint_name(0, 1)
    atomic_save({"w": torch.ones(3)}, path)
    with pytest.raises(RuntimeError, match="disk on fire"):
        atomic_save({"w": torch.zeros(3), "x": Exploding()}, path)
    assert torch.equal(load(path)["w"], torch.ones(3))
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]  # temporary file removed


def test_save_is_temp_file_fsync_replace_then_directory_fsync(tmp_path, monkeypatch):
    """The order that makes a save durable: data on disk before the rename, the rename after."""
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        kind = "dir" if os.path.isdir(f"/proc/self/fd/{fd}") else "file"
        events.append(f"fsync {kind}")
        real_fsync(fd)

    def replace(src, dst):
        assert os.path.dirname(src) == os.path.dirname(dst), "temporary file in another directory"
        assert os.path.getsize(src) > 0
        events.append("replace")
        real_replace(src, dst)

    monkeypatch.setattr(checkpoint_write.os, "fsync", fsync)
    monkeypatch.setattr(checkpoint_write.os, "replace", replace)
    atomic_save({"w": torch.ones(3)}, tmp_path / "a.ckpt")
    assert events == ["fsync file", "replace", "fsync dir"]


# -- checksums ----------------------------------------------------------------------------


def test_a_checkpoint_carries_the_sha256_of_its_bytes_and_stays_a_torch_file(tmp_path):
    path = tmp_path / "a.ckpt"
    atomic_save({"w": torch.arange(5.0)}, path)
    data = path.read_bytes()
    assert data[-78:-64] == b"tuneup-sha256:"
    assert data[-64:].decode() == hashlib.sha256(data[:-78]).hexdigest()
    assert zipfile.ZipFile(path).comment == data[-78:]  # a valid zip comment
    assert torch.equal(torch.load(path, weights_only=True)["w"], torch.arange(5.0))
    assert torch.equal(load(path)["w"], torch.arange(5.0))


def test_four_flipped_bytes_of_tensor_data_are_refused_by_their_checksum(tmp_path):
    path = tmp_path / checkpoint_name(0, 1)
    atomic_save({"w": torch.arange(1000.0)}, path)
    size = path.stat().st_size
    flip_tensor_bytes(path)
    assert path.stat().st_size == size
    torch.load(path, weights_only=True)  # torch alone reads the damaged numbers silently
    with pytest.raises(UnreadableCheckpoint, match=rf"{path.name} is corrupt: .*SHA-256"):
        load(path)
    with pytest.raises(UnreadableCheckpoint, match="corrupt"):
        checkpoint_io.AtomicCheckpointIO().load_checkpoint(path)  # Lightning's way in


def test_resume_auto_falls_back_past_a_corrupt_newest_file_naming_it(tmp_path, caplog):
    write(tmp_path, checkpoint_name(0, 1), 1.0, step=1)
    bad = write(tmp_path, checkpoint_name(0, 2), 2.0, step=2)
    flip_tensor_bytes(bad)
    path, state = newest_valid(tmp_path)
    assert path.name == checkpoint_name(0, 1) and float(state["w"][0]) == 1.0
    assert "skipping a bad checkpoint" in caplog.text and bad.name in caplog.text
    assert bad.exists()  # never deleted


def test_a_file_without_a_checksum_loads_with_a_warning(tmp_path, caplog):
    path = tmp_path / "old.ckpt"
    torch.save({"w": torch.ones(2)}, path)  # an older tuneup's, or another tool's
    assert torch.equal(load(path)["w"], torch.ones(2))
    assert "carries no checksum" in caplog.text and "old.ckpt" in caplog.text


def test_checkpoint_names_sort_in_training_order_and_need_no_quoting():
    names = [checkpoint_name(e, s) for e, s in ((0, 9), (1, 10), (9, 99), (10, 100))]
    assert names == sorted(names) and not any("=" in n for n in names)


# -- safe loading -------------------------------------------------------------------------


def test_truncated_empty_and_garbage_files_are_unreadable(tmp_path):
    good = write(tmp_path, "good.ckpt")
    data = good.read_bytes()
    cases = {"truncated.ckpt": data[: len(data) // 2], "empty.ckpt": b"", "garbage.ckpt": b"x" * 99}
    for name, content in cases.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(UnreadableCheckpoint, match=name):
            load(tmp_path / name)


@pytest.mark.parametrize("bare", [False, True], ids=["torch.save archive", "bare pickle"])
def test_a_pickle_payload_is_refused_and_never_runs(tmp_path, bare):
    marker = tmp_path / "MARKER"
    path = tmp_path / "evil.ckpt"
    if bare:
        import pickle

        path.write_bytes(pickle.dumps({"state_dict": {}, "x": Payload(marker)}))
    else:
        torch.save({"state_dict": {}, "x": Payload(marker)}, path)
    with pytest.raises(UnsafeCheckpoint) as info:
        load(path)
    assert "evil.ckpt" in str(info.value) and "arbitrary code" in str(info.value)
    with pytest.raises(UnsafeCheckpoint):
        checkpoint_io.AtomicCheckpointIO().load_checkpoint(path)
    assert not marker.exists()


# -- the newest valid checkpoint; pruning --------------------------------------------------


def test_newest_valid_skips_a_bad_newest_file_with_a_warning_and_deletes_nothing(tmp_path, caplog):
    write(tmp_path, checkpoint_name(0, 1), 1.0, age=10, step=1)
    write(tmp_path, checkpoint_name(0, 2), 2.0, age=20, step=2)  # older file time, further on
    bad = tmp_path / checkpoint_name(0, 3)
    bad.write_bytes(b"PK\x03\x04 half a zip")
    write(tmp_path, BEST, 9.0)  # never a resume candidate
    path, state = newest_valid(tmp_path)
    assert path.name == checkpoint_name(0, 2) and float(state["w"][0]) == 2.0
    assert bad.name in caplog.text and "skipping a bad checkpoint" in caplog.text
    assert len(list(tmp_path.glob("*.ckpt"))) == 4


def test_no_checkpoint_is_none_but_only_bad_ones_is_an_error(tmp_path):
    assert newest_valid(tmp_path / "missing") is None
    assert newest_valid(tmp_path) is None
    (tmp_path / checkpoint_name(0, 1)).write_bytes(b"")
    with pytest.raises(UnreadableCheckpoint, match="not starting from scratch"):
        newest_valid(tmp_path)


def test_an_unsafe_newest_file_is_an_error_not_skipped(tmp_path):
    write(tmp_path, checkpoint_name(0, 1), age=10, step=1)
    torch.save({"x": Payload(tmp_path / "MARKER")}, tmp_path / checkpoint_name(0, 2))
    with pytest.raises(UnsafeCheckpoint, match=checkpoint_name(0, 2)):
        newest_valid(tmp_path)
    assert not (tmp_path / "MARKER").exists()


def test_prune_keeps_the_k_furthest_trained_and_best_whatever_the_file_times(tmp_path):
    for step in range(1, 6):  # named in no order, and the furthest trained written "first"
        write(tmp_path, f"copy-{6 - step}.ckpt", age=step, step=step * 10)
    write(tmp_path, BEST, age=100, step=99)
    (tmp_path / "damaged.ckpt").write_bytes(b"PK\x03\x04 half a zip")
    deleted = prune(tmp_path, keep=2)
    assert sorted(p.name for p in deleted) == ["copy-3.ckpt", "copy-4.ckpt", "copy-5.ckpt"]
    kept = [p.name for p in list_checkpoints(tmp_path)]
    assert kept == ["copy-1.ckpt", "copy-2.ckpt"]  # steps 50 and 40
    assert (tmp_path / BEST).exists() and (tmp_path / "damaged" / "damaged.ckpt").exists()


def test_pruning_after_each_save_reads_each_file_once_and_a_file_written_anew_again(
    tmp_path, monkeypatch
):
    """Pruning runs after every save: it unpickled every kept checkpoint each time (40 % of a
    small run that saves every step). A file is now read once per process; one written anew
    under the same name (a new file renamed into place) is read again, its new progress used."""
    from tuneup.trainer.state import checkpoints

    reads = []
    real_load = checkpoints.load
    monkeypatch.setattr(
        checkpoints, "load", lambda path, **kw: reads.append(path.name) or real_load(path, **kw)
    )
    for step in range(1, 5):  # a save, then the prune that follows it
        write(tmp_path, checkpoint_name(0, step), step=step)
        prune(tmp_path, keep=2)
    assert reads == [checkpoint_name(0, step) for step in range(1, 5)]  # each one once
    assert [p.name for p in list_checkpoints(tmp_path)] == [
        checkpoint_name(0, 4),
        checkpoint_name(0, 3),
    ]
    write(tmp_path, checkpoint_name(0, 3), step=9)  # rewritten: now the furthest trained
    assert list_checkpoints(tmp_path)[0].name == checkpoint_name(0, 3)
    assert reads[-1] == checkpoint_name(0, 3)
    # what training saves (through its CheckpointIO) is known by what it wrote: never read back
    count, path = len(reads), tmp_path / checkpoint_name(0, 5)
    checkpoint_io.AtomicCheckpointIO().save_checkpoint(
        {"w": torch.ones(3), "global_step": 10}, path
    )
    assert prune(tmp_path, keep=2) and len(reads) == count
    assert list_checkpoints(tmp_path)[0] == path


# -- the data order -----------------------------------------------------------------------


def test_sampler_order_depends_on_seed_and_epoch_only():
    a, b = ResumableSampler(10, seed=3), ResumableSampler(10, seed=3)
    assert list(a) == list(b) and sorted(a) == list(range(10))
    b.set_epoch(1)
    assert list(b) != list(a) and sorted(b) == list(range(10))
    assert list(ResumableSampler(10, seed=4)) != list(a)


def test_ranks_share_an_epoch_without_overlap_like_distributed_sampler():
    from torch.utils.data import DistributedSampler

    shards = [list(ResumableSampler(10, seed=1, rank=r, num_replicas=3)) for r in range(3)]
    assert all(len(s) == 4 for s in shards)  # padded to 12, as DistributedSampler pads
    assert set().union(*shards) == set(range(10))
    for r in range(3):
        reference = DistributedSampler(range(10), num_replicas=3, rank=r, seed=1)
        assert shards[r] == list(reference)


def test_loader_resumes_at_the_batch_after_the_last_one_handed_out():
    data = torch.arange(20)
    full = ResumableLoader(
        data, batch_size=4, sampler=ResumableSampler(20, seed=5), generator=torch.Generator()
    )
    batches = list(full)
    partial = ResumableLoader(data, batch_size=4, sampler=ResumableSampler(20, seed=5))
    iterator = iter(partial)
    next(iterator), next(iterator)
    state = partial.state_dict()
    assert (state["epoch"], state["position"]) == (0, 8)
    resumed = ResumableLoader(data, batch_size=4, sampler=ResumableSampler(20, seed=5))
    resumed.load_state_dict(state)
    assert [b.tolist() for b in resumed] == [b.tolist() for b in batches[2:]]


def test_a_finished_epoch_is_saved_as_the_start_of_the_next():
    loader = ResumableLoader(torch.arange(8), batch_size=4, sampler=ResumableSampler(8))
    list(loader)
    assert (loader.state_dict()["epoch"], loader.state_dict()["position"]) == (1, 0)


def test_resuming_mid_epoch_over_other_data_is_refused():
    state = ResumableSampler(20).state_dict() | {"position": 8}
    with pytest.raises(Exception, match="cannot resume mid-epoch"):
        ResumableSampler(30).load_state_dict(state)


def test_loader_iteration_draws_nothing_from_the_global_rng():
    loader = ResumableLoader(
        torch.arange(8), batch_size=4, sampler=ResumableSampler(8), generator=torch.Generator()
    )
    before = torch.get_rng_state()
    list(loader)
    assert torch.equal(torch.get_rng_state(), before)


# -- RNG states ---------------------------------------------------------------------------


def test_rng_states_round_trip_through_a_weights_only_file(tmp_path):
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    np.random.standard_normal()  # a cached Gaussian is part of NumPy's state
    atomic_save({"rng": rng.capture_all_ranks()}, tmp_path / "r.ckpt")
    expected = (random.random(), np.random.standard_normal(), torch.rand(2))
    random.seed(9), np.random.seed(9), torch.manual_seed(9)
    rng.restore(rng.for_rank(load(tmp_path / "r.ckpt")["rng"], 0))
    assert (random.random(), np.random.standard_normal()) == expected[:2]
    assert torch.equal(torch.rand(2), expected[2])
    assert rng.for_rank([{}], 1) is None  # more ranks than states: nothing to restore


# -- divergence ---------------------------------------------------------------------------


def test_a_nonfinite_loss_names_step_and_rank():
    watch = LossWatch()
    watch.observe(torch.tensor(1.0), step=1, epoch=0, batch=0, rank=0)
    with pytest.raises(Diverged, match=r"loss was nan in step 7 \(epoch 1, batch 3 .*rank 2"):
        watch.observe(torch.tensor(float("nan")), step=7, epoch=1, batch=3, rank=2)


def test_a_deferred_check_says_when_the_bad_micro_batch_held_nan_data():
    watch = LossWatch()
    tokens, images = torch.zeros(2, 3, dtype=torch.long), torch.ones(2, 3)
    watch.observe(
        torch.tensor(1.0), step=1, epoch=0, batch=0, rank=0, deferred=True, data=(images, tokens)
    )
    bad = images.clone()
    bad[1, 2] = math.inf
    watch.observe(
        torch.tensor(math.nan),
        step=2,
        epoch=0,
        batch=1,
        rank=0,
        deferred=True,
        data={"pixels": bad, "labels": tokens},
    )
    with pytest.raises(
        Diverged,
        match=r"^the data holds NaN or inf: .*step 2 .*batch held "
        r"non-finite values\. The training did not diverge",
    ):
        watch.check()
    healthy = LossWatch()  # a NaN loss on finite data is still divergence
    healthy.observe(
        torch.tensor(math.nan),
        step=1,
        epoch=0,
        batch=0,
        rank=0,
        deferred=True,
        data=(images, tokens),
    )
    with pytest.raises(Diverged, match=r"^training diverged: .*Lower the learning rate"):
        healthy.check()


def test_nonfinite_weights_are_named():
    state = {"a": torch.ones(2), "b": torch.tensor([1.0, float("inf")]), "n": torch.ones(2).long()}
    assert nonfinite_tensors(state) == ["b"]
    assert nonfinite_tensors({"a": torch.ones(2)}) == []


def test_a_deferred_check_names_the_first_bad_micro_batch_when_read():
    """The CUDA / multi-process path: nothing is read per step; the check finds the first one."""
    watch = LossWatch()
    for batch, value in enumerate([1.0, float("inf"), float("nan")]):
        watch.observe(
            torch.tensor(value), step=batch + 1, epoch=0, batch=batch, rank=1, deferred=True
        )
    with pytest.raises(Diverged, match=r"loss was inf in step 2 \(epoch 0, batch 1 .*rank 1"):
        watch.check()
    healthy = LossWatch()
    healthy.observe(torch.tensor(1.0), step=1, epoch=0, batch=0, rank=0, deferred=True)
    healthy.check()
    with pytest.raises(Diverged, match="on another rank"):
        healthy.check(any_rank=lambda bad: True)


def test_a_full_disk_during_a_save_says_so_and_keeps_the_previous_file(tmp_path, monkeypatch):
    path = tmp_path / "checkpoints" / "epoch000-step00000002.ckpt"
    checkpoint_write.atomic_save({"step": 1}, path)
    before = path.read_bytes()

    class FullDisk:
        """A file whose writes fail once the first block is on disk, as on a full disk."""

        def __init__(self, raw):
            self.raw, self.writes = raw, 0

        def write(self, data):
            self.writes += 1
            if self.writes > 1:
                raise OSError(errno.ENOSPC, "No space left on device")
            return self.raw.write(data)

        def __getattr__(self, name):
            return getattr(self.raw, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.raw.close()

    monkeypatch.setattr(checkpoint_write, "open", lambda *a: FullDisk(open(*a)), raising=False)  # noqa: SIM115
    with pytest.raises(
        TuneupError,
        match=r"no space left to save .*step00000002.ckpt \(No space "
        r"left on device; \d+ MiB free on that file system\): the checkpoints "
        r"written before are kept",
    ):
        checkpoint_write.atomic_save({"step": 2, "big": torch.zeros(100_000)}, path)
    assert path.read_bytes() == before
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary left


def test_resume_of_a_damaged_checkpoint_names_the_intact_ones_beside_it(tmp_path):
    from tuneup.trainer.state.resume import resolve

    folder = tmp_path / "old_run" / "checkpoints"
    folder.mkdir(parents=True)
    for step in (27, 28, 29):
        write(folder, checkpoint_name(0, step), float(step), step=step)
    bad = write(folder, checkpoint_name(0, 30), 30.0, step=30)
    flip_tensor_bytes(bad)
    flip_tensor_bytes(
        write(folder, checkpoint_name(0, 31), 31.0, step=31)
    )  # damaged too: not named
    with pytest.raises(UnreadableCheckpoint) as info:
        resolve(str(bad), tmp_path / "new_run")
    said = str(info.value)
    assert said.startswith(f"{bad} is corrupt: its bytes do not match")  # what is wrong, first
    intact = [checkpoint_name(0, s) for s in (29, 28, 27)]
    assert (
        f"Intact beside it, newest first: {intact[0]} (step 29), {intact[1]} (step 28), "
        f"{intact[2]} (step 27); continue with resume={folder / intact[0]}, or resume=auto "
        f"hydra.run.dir={tmp_path / 'old_run'}"
    ) in said
    assert checkpoint_name(0, 31) not in said
    with pytest.raises(UnreadableCheckpoint, match=r"or resume=auto \(the newest intact one\)"):
        resolve(str(bad), tmp_path / "old_run")  # in its own run directory: resume=auto
    path, _ = resolve("auto", tmp_path / "old_run")  # which is what auto picks
    assert path.name == intact[0]
    shards = folder / checkpoint_name(0, 32)  # a sharded one whose shard's bytes changed
    shards.mkdir()
    (shards / ".metadata").write_bytes(b"index")
    (shards / "__1_0.distcp").write_bytes(b"shard one")
    sharded.write_manifest(shards, {"__1_0.distcp": sharded.sha256(shards / "__1_0.distcp")})
    (shards / "__1_0.distcp").write_bytes(b"shard 0ne")
    with pytest.raises(UnreadableCheckpoint) as info:
        resolve(str(shards), tmp_path / "new_run")
    assert str(info.value).startswith(f"{shards / '__1_0.distcp'} is corrupt")
    assert f"newest first: {intact[0]} (step 29), {intact[1]} (step 28)" in str(info.value)
