"""Reading one checkpoint file: checksum first, then safe loading only (:func:`load_file`).

The checksum (sealed into the file by checkpoint_write.py) is verified first: a mismatch
is :class:`UnreadableCheckpoint`, like a truncated file; a file without one, written
before tuneup had checksums or by another tool, loads with a warning. Then
``torch.load(weights_only=True)`` only. A file that needs anything else (a pickled
object, a class, a function) is refused with :class:`UnsafeCheckpoint`; there is no
fallback to unsafe loading. A sharded checkpoint (sharded.py) reads its ``meta.pt`` here;
checkpoint_read.py reads either kind.
"""

from __future__ import annotations

import hashlib
import logging
import pickle
import re
import zipfile
from pathlib import Path

import torch

from tuneup.errors import TuneupError
from tuneup.trainer.state.checkpoint_write import COMMENT_LENGTH, EOCD, EOCD_SIZE, SEAL, SEAL_SIZE

log = logging.getLogger(__name__)


class UnreadableCheckpoint(TuneupError):
    """The file is not a complete checkpoint (truncated, empty, garbage)."""


class UnsafeCheckpoint(TuneupError):
    """The file holds pickled Python objects that ``weights_only=True`` loading refuses."""


def recorded_checksum(path: Path) -> str | None:
    """The SHA-256 the file was sealed with (hex), or None when it carries none."""
    size = path.stat().st_size
    if size < EOCD_SIZE + SEAL_SIZE:
        return None
    with open(path, "rb") as f:
        f.seek(size - EOCD_SIZE - SEAL_SIZE)
        tail = f.read()
    end, comment = tail[:EOCD_SIZE], tail[EOCD_SIZE:]
    length = int.from_bytes(end[COMMENT_LENGTH], "little")
    if end[:4] != EOCD or length != SEAL_SIZE or not comment.startswith(SEAL):
        return None
    return comment[len(SEAL) :].decode("ascii", errors="replace")


def actual_checksum(path: Path, chunk: int = 1 << 20) -> str:
    """The SHA-256 of the file's bytes before its seal (the last ``SEAL_SIZE`` bytes)."""
    digest = hashlib.sha256()
    remaining = path.stat().st_size - SEAL_SIZE
    buffer = bytearray(chunk)
    with open(path, "rb", buffering=0) as f:
        while remaining > 0:
            got = f.readinto(memoryview(buffer)[: min(chunk, remaining)])
            if not got:
                break
            digest.update(memoryview(buffer)[:got])
            remaining -= got
    return digest.hexdigest()


_unsealed_warned: set[str] = set()


def verify_file(path: Path) -> None:
    """Raise :class:`UnreadableCheckpoint` when the file's bytes are not those it was sealed
    with; warn (once per file) when it carries no checksum to compare with."""
    expected = recorded_checksum(path)
    if expected is None:
        if str(path) not in _unsealed_warned:
            _unsealed_warned.add(str(path))
            log.warning(
                "%s carries no checksum (written by another tool or an older tuneup); "
                "its bytes cannot be verified",
                path,
            )
        return
    actual = actual_checksum(path)
    if actual != expected:
        raise UnreadableCheckpoint(
            f"{path} is corrupt: its bytes do not match the SHA-256 it was written with "
            f"(recorded {expected[:12]}..., found {actual[:12]}...); damaged on disk or in a copy"
        )


def load_file(
    path: str | Path, map_location="cpu", mmap: bool = False, verify_checksum: bool = True
):
    """Read a checkpoint file with ``torch.load(weights_only=True)``; never anything less safe.

    The checksum is verified first (reading the whole file) unless ``verify_checksum=False``;
    ``mmap=True`` maps tensor data instead of reading it. Raises :class:`UnsafeCheckpoint`
    or :class:`UnreadableCheckpoint`, each naming the file.
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
    if verify_checksum:
        verify_file(path)
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
