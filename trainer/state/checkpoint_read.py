"""Reading a checkpoint, a file or a sharded directory: verified first, safe loading only.

One file: checkpoint_file.py (its checksum, then ``torch.load(weights_only=True)``); a
directory written by ``torch.distributed.checkpoint``: sharded.py (its manifest, then
``meta.pt`` and the tensors' shapes). Either raises :class:`UnreadableCheckpoint` for a
damaged or incomplete checkpoint and :class:`UnsafeCheckpoint` for one that holds pickled
objects, each naming the file.
"""

from __future__ import annotations

from pathlib import Path

from tuneup.trainer.state import sharded
from tuneup.trainer.state.checkpoint_file import (
    UnreadableCheckpoint,
    UnsafeCheckpoint,
    load_file,
    verify_file,
)

__all__ = ["UnreadableCheckpoint", "UnsafeCheckpoint", "load", "verify"]


def verify(path: str | Path) -> None:
    """Raise :class:`UnreadableCheckpoint` when the checkpoint's bytes are not those it was
    written with: a file against its sealed checksum (a warning, once per file, when it
    carries none), a directory (a sharded checkpoint) file by file against its manifest."""
    if sharded.is_sharded(path):
        return sharded.verify(Path(path))
    return verify_file(Path(path))


def load(path: str | Path, map_location="cpu", mmap: bool = False, verify_checksum: bool = True):
    """Read a checkpoint with ``torch.load(weights_only=True)``; never anything less safe.

    The checksum is verified first (reading the whole file) unless ``verify_checksum=False``;
    ``mmap=True`` maps tensor data instead of reading it. A sharded checkpoint's tensors stay
    on disk: its ``state_dict`` holds their shapes only (:func:`.sharded.load_meta`). Raises
    :class:`UnsafeCheckpoint` or :class:`UnreadableCheckpoint`, each naming the file.
    """
    if sharded.is_sharded(path):
        return sharded.load_meta(Path(path), verify_checksum)
    return load_file(path, map_location, mmap, verify_checksum)
