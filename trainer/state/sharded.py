"""Sharded checkpoints: a directory written by ``torch.distributed.checkpoint`` (DCP), each
process its own shard, with the guarantees of tuneup's single files.

Layout (Lightning's ``ModelParallelStrategy`` layout, so Lightning's tools read it too)::

    epoch000-step00000010.ckpt/
        .metadata             DCP's index: each tensor's global shape and where its pieces are
        __0_0.distcp ...      the pieces rank 0 wrote (one file per rank and writer thread)
        meta.pt               the rest of the Lightning checkpoint: loops, callbacks, tuneup's
                              state (written by rank 0, sealed with a checksum like any file)
        tuneup-sha256.json    the SHA-256 of every file above: written last

Atomic: the directory is written under a hidden temporary name next to its final one
(``.NAME.tmp-<id>``); each rank hashes the files it wrote, rank 0 writes the manifest,
fsyncs it and renames the directory onto its final name (a directory being replaced, e.g.
``best.ckpt``, is moved aside first and deleted after). A save killed at any moment leaves
the previous checkpoints and, at most, a temporary directory that the next run removes.
With ``checkpoint.async=true`` the same steps run in the background: the shards copied to
host memory and written by DCP's ``async_save``, then the checksums, manifest and rename.

Verified on load (:func:`verify`, with the manifest's writing in
:mod:`tuneup.trainer.state.sharded_manifest`): no manifest means the save did not finish; a
file whose bytes do not hash to the manifest's value is damaged. Either is
:class:`~tuneup.trainer.state.checkpoint_file.UnreadableCheckpoint`, so ``resume=auto``
falls back to the previous checkpoint and says so, as for a single file.

DCP reshards on load: a checkpoint written by 4 processes loads into 2, into 1, or into a
plain ``strategy=auto`` model (:func:`full_checkpoint`, which is also what
``tuneup-consolidate`` writes from).

Plugin state shaped like the model (an EMA of the weights): a plugin's state dict entry
``model_shaped`` (:data:`MODEL_SHAPED`), tensors keyed as the model's state_dict and laid
out as its (DTensor) shards, is written by every rank into the DCP files under
``tuneup.<plugin>`` (meta.pt holds only a marker) and read back into this run's layout
(:func:`load_plugin_shards`), or as full tensors by :func:`full_checkpoint`.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import torch

from tuneup.trainer.state.checkpoint_file import UnreadableCheckpoint, load_file
from tuneup.trainer.state.sharded_manifest import MANIFEST as MANIFEST
from tuneup.trainer.state.sharded_manifest import sha256, verify, write_manifest

META = "meta.pt"  # lightning_fabric.utilities.load._METADATA_FILENAME
TEMP_MARK = ".tmp-"
OLD_MARK = ".old-"
STATE_PREFIX = "state_dict."
MODEL_SHAPED = "model_shaped"  # plugins/ema.py's key: a plugin's state shaped like the model
IN_SHARDS = "in the DCP files"  # what meta.pt holds in its place
PLUGIN_PREFIX = "tuneup."  # DCP key of a plugin's model-shaped state: tuneup.<plugin name>


def is_sharded(path: str | Path) -> bool:
    return Path(path).is_dir()


# --------------------------------------------------------------------------------------
# writing
# --------------------------------------------------------------------------------------


def save(strategy, checkpoint: dict, path: Path) -> None:
    """Write ``checkpoint`` (Lightning's dict) as a sharded directory at ``path``, atomically.

    Collective: every rank calls it. ``strategy`` gives rank, barrier and all-gather. With a
    background writer (``checkpoint.async=true``: ``strategy.checkpoint_io.writer``) DCP's
    ``async_save`` copies the shards to host memory and writes them in the background, on a
    process group of their own; the checksums, manifest and rename (:func:`finish`) follow
    there, once every rank's write is done.
    """
    from lightning_fabric.strategies.model_parallel import _distributed_checkpoint_save

    from tuneup.trainer.state.checkpoint_write import atomic_save

    writer = getattr(strategy.checkpoint_io, "writer", None)
    if writer is not None:
        writer.wait()  # one save at a time; a failed one raises here
    rank = strategy.global_rank
    token = strategy.broadcast(f"{os.getpid()}")
    temp = path.with_name(f".{path.name}{TEMP_MARK}{token}")
    if rank == 0:
        shutil.rmtree(temp, ignore_errors=True)
        temp.mkdir(parents=True)
    strategy.barrier()
    shards = {"state_dict": checkpoint.pop("state_dict")}
    for i, state in enumerate(checkpoint.pop("optimizer_states", [])):
        shards[f"optimizer_{i}"] = state
    for name, state in plugin_shards(checkpoint).items():
        shards[PLUGIN_PREFIX + name] = state[MODEL_SHAPED]
        state[MODEL_SHAPED] = IN_SHARDS
    if rank == 0:  # the rest, small: written now (it is the state as of now)
        atomic_save(checkpoint, temp / META)
    if writer is None:
        _distributed_checkpoint_save(shards, temp)
        finish(rank, strategy.world_size, temp, path)
        strategy.barrier()
        return
    from torch.distributed.checkpoint import async_save

    group = writer.process_group(getattr(strategy, "_timeout", None))
    started = time.perf_counter()
    written = async_save(
        shards, checkpoint_id=temp, process_group=group, async_stager=writer.staging()
    )
    writer.staged_s += time.perf_counter() - started
    writer.submit(lambda: (written.result(), finish(rank, strategy.world_size, temp, path, group)))


def finish(rank: int, world_size: int, temp: Path, path: Path, group=None) -> None:
    """After every rank wrote its files into ``temp``: each hashes its own, rank 0 gathers the
    hashes (so every rank's write is complete), writes the manifest, fsyncs and renames."""
    from tuneup.trainer.state.checkpoint_write import fsync_directory

    mine = {p.name: sha256(p) for p in sorted(temp.glob(f"__{rank}_*"))}
    gathered = [None] * world_size
    torch.distributed.all_gather_object(gathered, mine, group=group)
    if rank != 0:
        return
    hashes = {name: digest for part in gathered for name, digest in part.items()}
    for extra in sorted(temp.iterdir()):
        if extra.name not in hashes and extra.is_file():
            hashes[extra.name] = sha256(extra)
    write_manifest(temp, hashes)
    fsync_directory(temp)
    replace(temp, path)
    fsync_directory(path.parent)


def plugin_shards(checkpoint: dict, marked: bool = False) -> dict[str, dict]:
    """The plugin states of ``checkpoint`` with model-shaped tensors (``marked``: those whose
    tensors are in the DCP files)."""
    return {
        name: state
        for name, state in (checkpoint.get("tuneup") or {}).items()
        if isinstance(state, dict) and isinstance(state.get(MODEL_SHAPED), str if marked else dict)
    }


def replace(temp: Path, path: Path) -> None:
    """Rename ``temp`` onto ``path``; an existing ``path`` is moved aside, then deleted."""
    old = None
    if path.exists():
        old = path.with_name(f".{path.name}{OLD_MARK}{os.getpid()}")
        os.rename(path, old)
    os.rename(temp, path)
    if old is not None:
        remove(old)


def remove(path: Path) -> None:
    """Delete a checkpoint, a file or a directory."""
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def leftovers(directory: Path) -> list[Path]:
    """Temporary or moved-aside directories of saves that were killed."""
    return [
        p
        for p in directory.glob(".*")
        if p.is_dir() and (TEMP_MARK in p.name or OLD_MARK in p.name)
    ]


# --------------------------------------------------------------------------------------
# reading
# --------------------------------------------------------------------------------------


def load_meta(path: Path, verify_checksum: bool = True) -> dict:
    """The checkpoint without its tensors' values: ``meta.pt``, plus ``state_dict`` as empty
    tensors of the saved (global) shapes, from DCP's index, for the resume checks."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    if verify_checksum:
        verify(path)
    if not (path / META).is_file():
        raise UnreadableCheckpoint(f"{path} is not a complete sharded checkpoint: no {META}")
    contents = load_file(
        path / META, verify_checksum=False
    )  # the manifest covers it (or not asked)
    try:
        index = FileSystemReader(str(path)).read_metadata().state_dict_metadata
    except Exception as exc:  # a damaged .metadata: DCP raises what its unpickler raises
        raise UnreadableCheckpoint(f"{path}/.metadata cannot be read: {exc}") from None
    contents["state_dict"] = {
        key.removeprefix(STATE_PREFIX): torch.empty(item.size, device="meta")
        for key, item in index.items()
        if key.startswith(STATE_PREFIX) and isinstance(item, TensorStorageMetadata)
    }
    return contents


def full_checkpoint(path: Path) -> dict:
    """The whole checkpoint in one process, full tensors (DCP reassembles the shards): the
    model's ``state_dict``, ``optimizer_states`` as a plain torch optimizer keeps them, and
    the rest. Needs no process group."""
    from lightning_fabric.utilities.load import _load_distributed_checkpoint

    checkpoint = _load_distributed_checkpoint(path)  # state_dict, optimizer_0... and meta.pt
    states = []
    while f"optimizer_{len(states)}" in checkpoint:
        states.append(by_index(checkpoint.pop(f"optimizer_{len(states)}")))
    checkpoint["optimizer_states"] = states
    for name, state in plugin_shards(checkpoint, marked=True).items():
        state[MODEL_SHAPED] = checkpoint.pop(PLUGIN_PREFIX + name)
    return checkpoint


def load_plugin_shards(path: Path, checkpoint: dict, model) -> None:
    """Read the model-shaped plugin states of ``checkpoint`` (meta.pt's, from the sharded
    checkpoint at ``path``) into tensors laid out as ``model``'s state_dict is in this run.
    Collective: every rank calls it."""
    from lightning_fabric.strategies.model_parallel import _distributed_checkpoint_load
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    wanted = plugin_shards(checkpoint, marked=True)
    if not wanted:
        return
    like = get_model_state_dict(model)
    index = FileSystemReader(str(path)).read_metadata().state_dict_metadata
    for name, state in wanted.items():
        prefix = f"{PLUGIN_PREFIX}{name}."
        keys = [key.removeprefix(prefix) for key in index if key.startswith(prefix)]
        unknown = sorted(set(keys) - set(like))
        if unknown:
            raise UnreadableCheckpoint(
                f"{path}: plugin '{name}' saved tensors the model does not have ({unknown[:3]}); "
                "resume it with the model it was trained with"
            )
        template = {key: torch.empty_like(like[key]) for key in keys}
        _distributed_checkpoint_load({PLUGIN_PREFIX + name: template}, path)
        state[MODEL_SHAPED] = template


def by_index(state: dict) -> dict:
    """An optimizer state keyed by parameter name (DCP's) as ``Optimizer.state_dict()`` keys it:
    by position, in the order of the parameter groups.

    DCP writes nothing for an empty dict, so the state of an optimizer that keeps none per
    parameter (plain SGD: no momentum) comes back without its ``state`` entry at all; a
    parameter without state (not yet stepped) has none either."""
    index, groups, per_param = 0, [], {}
    saved = state.get("state") or {}
    for group in state["param_groups"]:
        ids = []
        for name in group["params"]:
            if name in saved:
                per_param[index] = saved[name]
            ids.append(index)
            index += 1
        groups.append({**group, "params": ids})
    return {"state": per_param, "param_groups": groups}
