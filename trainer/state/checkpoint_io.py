"""Checkpoint files on disk: atomic writes, safe reads, the newest valid one, pruning.

Writing (:func:`atomic_save`): ``torch.save`` into a hidden temporary file in
the checkpoint's own directory, flush and ``fsync`` it, ``os.replace`` it onto
the final name, then ``fsync`` the directory so the rename itself is durable.
A crash at any moment leaves either the old file or the complete new one under
the final name, never a partial file. Lightning's ``TorchCheckpointIO`` falls
short of this: it serialises into memory, writes a temporary file through
fsspec in the *system* temp directory and ``shutil.move``s it, which across
filesystems (``/tmp`` vs. a cluster's shared filesystem) is a copy onto the
final name, and nothing is fsynced. :class:`AtomicCheckpointIO` puts our
functions behind Lightning's CheckpointIO interface.

Reading (:func:`load`): ``torch.load(weights_only=True)`` only. A file that
needs anything else (a pickled object, a class, a function) is refused with
:class:`UnsafeCheckpoint`; there is no fallback to unsafe loading. A file that
is not a complete checkpoint raises :class:`UnreadableCheckpoint`.
"""

from __future__ import annotations

import logging
import os
import pickle
import re
import zipfile
from pathlib import Path

import torch
from lightning_fabric.plugins.io.torch_io import TorchCheckpointIO

from tuneup import TuneupError

log = logging.getLogger(__name__)

SUFFIX = ".ckpt"
#: The best-by-metric checkpoint: kept apart, never pruned, not a resume=auto candidate.
BEST = "best.ckpt"
_TEMP_PREFIX = "."
_TEMP_MARK = ".tmp-"


class UnreadableCheckpoint(TuneupError):
    """The file is not a complete checkpoint (truncated, empty, garbage)."""


class UnsafeCheckpoint(TuneupError):
    """The file holds pickled Python objects that ``weights_only=True`` loading refuses."""


def checkpoint_name(epoch: int, step: int) -> str:
    """``epoch002-step00000123.ckpt``: zero-padded so names sort in training order, and free
    of ``=`` so the path can be given as ``resume=<path>`` on a Hydra command line."""
    return f"epoch{epoch:03d}-step{step:08d}{SUFFIX}"


# --------------------------------------------------------------------------------------
# writing
# --------------------------------------------------------------------------------------


def atomic_save(checkpoint: dict, path: str | Path) -> None:
    """``torch.save(checkpoint, path)`` such that ``path`` is never partially written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f"{_TEMP_PREFIX}{path.name}{_TEMP_MARK}{os.getpid()}")
    try:
        with open(temp, "wb") as f:
            torch.save(checkpoint, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    fsync_directory(path.parent)


def fsync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` durable (POSIX; a no-op where directories cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_leftover_temporaries(directory: Path) -> list[Path]:
    """Delete temporary files of saves that were killed mid-write (they are never checkpoints)."""
    found = [p for p in Path(directory).glob(f"{_TEMP_PREFIX}*{SUFFIX}{_TEMP_MARK}*")]
    for path in found:
        path.unlink(missing_ok=True)
    return found


# --------------------------------------------------------------------------------------
# reading
# --------------------------------------------------------------------------------------


def load(path: str | Path, map_location="cpu", mmap: bool = False) -> dict:
    """Read a checkpoint with ``torch.load(weights_only=True)``; never anything less safe.

    ``mmap=True`` maps tensor data instead of reading it (a cheap validity check).
    Raises :class:`UnsafeCheckpoint` or :class:`UnreadableCheckpoint`, each naming the file.
    """
    path = Path(path)
    if not zipfile.is_zipfile(path):
        with open(path, "rb") as f:
            head = f.read(2)
        if head[:1] == b"\x80":  # pickle's PROTO opcode: a bare pickle, not a torch.save archive
            raise UnsafeCheckpoint(
                f"{path} is a bare pickle, not a checkpoint archive; tuneup does not unpickle "
                "files (they can run arbitrary code). Use a checkpoint tuneup wrote."
            )
        raise UnreadableCheckpoint(
            f"{path} is not a complete checkpoint ({path.stat().st_size} bytes; truncated, "
            "empty or not written by torch.save)"
        )
    try:
        return torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as exc:
        if "Weights only load failed" not in str(exc):
            raise UnreadableCheckpoint(f"{path} is corrupt: {exc}") from None
        found = re.search(r"GLOBAL ([\w.]+)", str(exc))
        what = f" ({found.group(1)})" if found else ""
        raise UnsafeCheckpoint(
            f"{path} holds a pickled Python object{what} that safe loading "
            "(torch.load weights_only=True) refuses: loading it could run arbitrary code. "
            "tuneup checkpoints hold only tensors and plain containers; this file was not "
            "written by tuneup or was tampered with. It is not loaded."
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError, KeyError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UnreadableCheckpoint(f"{path} is not a complete checkpoint: {reason}") from None


# --------------------------------------------------------------------------------------
# a directory of checkpoints
# --------------------------------------------------------------------------------------


def list_checkpoints(directory: str | Path) -> list[Path]:
    """The resumable checkpoints in ``directory``, newest first (last written; then by name).

    ``best.ckpt`` is left out: it is a copy for the user, not where training stopped.
    """
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [p for p in directory.glob(f"*{SUFFIX}") if p.is_file() and p.name != BEST]
    return sorted(found, key=lambda p: (p.stat().st_mtime_ns, p.name), reverse=True)


def newest_valid(directory: str | Path) -> tuple[Path, dict] | None:
    """The newest checkpoint in ``directory`` that loads, and its contents (tensors memory-mapped).

    Each unreadable newer file is skipped with a warning naming it; none is
    deleted. An unsafe file is never skipped: :class:`UnsafeCheckpoint` is raised.
    Returns None when the directory holds no checkpoint at all; raises
    :class:`UnreadableCheckpoint` when it holds some but none loads.
    """
    candidates = list_checkpoints(directory)
    for path in candidates:
        try:
            return path, load(path, mmap=True)
        except UnreadableCheckpoint as exc:
            log.warning("skipping a bad checkpoint: %s; trying the previous one", exc)
    if candidates:
        raise UnreadableCheckpoint(
            f"none of the {len(candidates)} checkpoint(s) in {directory} can be read "
            f"(newest: {candidates[0].name}); not starting from scratch. Start a fresh run "
            "in another directory (hydra.run.dir=...), or resume=<path> a good copy"
        )
    return None


def prune(directory: str | Path, keep: int) -> list[Path]:
    """Delete all but the ``keep`` newest resumable checkpoints; return what was deleted."""
    doomed = list_checkpoints(directory)[keep:]
    for path in doomed:
        path.unlink(missing_ok=True)
    return doomed


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint reader/writer, with :func:`atomic_save` and safe :func:`load`."""

    def save_checkpoint(self, checkpoint, path, storage_options=None) -> None:
        if storage_options is not None:
            raise TypeError("AtomicCheckpointIO takes no storage_options")
        atomic_save(checkpoint, path)

    def load_checkpoint(self, path, map_location=None, weights_only=None) -> dict:
        if not Path(path).is_file():
            raise TuneupError(f"checkpoint {path} does not exist")
        return load(path, map_location=map_location or "cpu")
