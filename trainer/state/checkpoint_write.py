"""Writing a checkpoint file: atomic, checksummed (:func:`atomic_save`).

``torch.save`` into a hidden temporary file in the checkpoint's own directory, flush and
``fsync`` it, ``os.replace`` it onto the final name, then ``fsync`` the directory so the
rename itself is durable. A crash at any moment leaves either the old file or the complete
new one under the final name, never a partial file. Lightning's ``TorchCheckpointIO`` falls
short of this: it serialises into memory, writes a temporary file through fsspec in the
*system* temp directory and ``shutil.move``s it, which across filesystems (``/tmp`` vs. a
cluster's shared filesystem) is a copy onto the final name, and nothing is fsynced.

Checksum: the SHA-256 of the file's bytes travels inside the file, as the comment
of its zip archive (``tuneup-sha256:<hex>``, the last 78 bytes; the digest covers
every byte before them). It is computed while ``torch.save`` streams the archive
out, so a save reads nothing back, and it lives and dies with the file in the same
rename: no second file to lose or to get out of step. ``torch.load`` and every zip
reader accept the comment, so the file is still a plain torch checkpoint. By hand:
``head -c -78 FILE | sha256sum`` against ``tail -c 64 FILE``. (The archive's own
CRC-32s are not used: torch computes them only when configured to, and checks
none of them on load.) Reading it back: checkpoint_read.py.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
from pathlib import Path

import torch

from tuneup.errors import TuneupError

#: A save's temporary file: this prefix, the final name, this mark, the writer's pid.
TEMP_PREFIX = "."
TEMP_MARK = ".tmp-"
#: The zip archive's comment that carries the checksum: this prefix, then 64 hex digits.
SEAL = b"tuneup-sha256:"
SEAL_SIZE = len(SEAL) + 64
#: The zip "end of central directory" record: its signature, its size without the comment,
#: and where its 2-byte comment length sits in it.
EOCD, EOCD_SIZE, COMMENT_LENGTH = b"PK\x05\x06", 22, slice(20, 22)


def atomic_save(checkpoint: dict, path: str | Path) -> None:
    """``torch.save(checkpoint, path)`` such that ``path`` is never partially written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f"{TEMP_PREFIX}{path.name}{TEMP_MARK}{os.getpid()}")
    sealed = None
    try:
        with open(temp, "wb") as f:
            sealed = Sealed(f)
            torch.save(checkpoint, sealed)
            sealed.seal()
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    except BaseException as exc:
        temp.unlink(missing_ok=True)
        cause = sealed.error if sealed is not None and sealed.error is not None else exc
        if isinstance(cause, OSError) and cause.errno in (errno.ENOSPC, errno.EDQUOT):
            raise disk_full(path, cause) from exc
        raise
    fsync_directory(path.parent)


def disk_full(path: Path, cause: OSError) -> TuneupError:
    """A save that ran out of space, said as such (torch reports it as "unexpected pos")."""
    free = shutil.disk_usage(path.parent).free
    return TuneupError(
        f"no space left to save {path} ({cause.strerror}; {free / 2**20:.0f} MiB free on that "
        "file system): the checkpoints written before are kept and nothing half-written was "
        "left. Free space, keep fewer (resume=auto checkpoint.keep_last=<fewer>: the oldest "
        "are deleted before the next save), or give the run a larger file system: "
        "hydra.run.dir=<directory>"
    )


class Sealed:
    """The stream ``torch.save`` writes to: hashes what passes, and seals the archive.

    torch writes a zip archive sequentially, ending with its 22-byte "end of central
    directory" record. That record is held back until :meth:`seal`, which sets its
    comment length and appends the checksum as the comment.
    """

    def __init__(self, raw) -> None:
        self.raw, self.digest, self.held = raw, hashlib.sha256(), b""
        self.error: OSError | None = None  # torch's writer hides it behind "unexpected pos"

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        if len(view) >= EOCD_SIZE:
            self._emit(self.held)
            self._emit(view[:-EOCD_SIZE])
            self.held = bytes(view[-EOCD_SIZE:])
        else:
            joined = self.held + bytes(view)
            self._emit(joined[:-EOCD_SIZE])
            self.held = joined[-EOCD_SIZE:]
        return len(view)

    def flush(self) -> None:
        self.raw.flush()

    def _emit(self, data) -> None:
        self.digest.update(data)
        try:
            self.raw.write(data)
        except OSError as exc:
            self.error = exc
            raise

    def seal(self) -> None:
        end = self.held
        if len(end) != EOCD_SIZE or end[:4] != EOCD or end[COMMENT_LENGTH] != b"\0\0":
            raise RuntimeError("torch.save did not end with a zip end-of-directory record")
        self._emit(end[:20] + SEAL_SIZE.to_bytes(2, "little"))
        self.raw.write(SEAL + self.digest.hexdigest().encode())
        self.held = b""


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
