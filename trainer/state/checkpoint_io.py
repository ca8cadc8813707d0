"""Checkpoint files on disk: atomic, checksummed writes; safe reads; the newest one; pruning.

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

Checksum: the SHA-256 of the file's bytes travels inside the file, as the comment
of its zip archive (``tuneup-sha256:<hex>``, the last 78 bytes; the digest covers
every byte before them). It is computed while ``torch.save`` streams the archive
out, so a save reads nothing back, and it lives and dies with the file in the same
rename: no second file to lose or to get out of step. ``torch.load`` and every zip
reader accept the comment, so the file is still a plain torch checkpoint. By hand:
``head -c -78 FILE | sha256sum`` against ``tail -c 64 FILE``. (The archive's own
CRC-32s are not used: torch computes them only when configured to, and checks
none of them on load.)

Reading (:func:`load`): the checksum first (a mismatch is :class:`UnreadableCheckpoint`,
like a truncated file; a file without one, written before tuneup had checksums or by
another tool, loads with a warning), then ``torch.load(weights_only=True)`` only. A
file that needs anything else (a pickled object, a class, a function) is refused with
:class:`UnsafeCheckpoint`; there is no fallback to unsafe loading.

Order (:func:`list_checkpoints`): "newest" is the furthest training progress
recorded in a file (optimizer steps, then micro-batches, then epochs), never its
modification time, which ``cp -r``, ``rsync`` without ``-t`` or a restore from backup
rewrite: a copied run resumes from its real last step, and pruning never deletes it.

Damaged checkpoints (:func:`set_aside`): a file that cannot be read, or that resume=auto
skipped because its bytes failed their checksum, is moved into ``checkpoints/damaged/``:
kept for whoever looks into it, never a resume candidate, never counted toward
``keep_last`` and never pruned; a later save of the same step cannot overwrite it.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import pickle
import re
import shutil
import zipfile
from dataclasses import dataclass
from pathlib import Path

import torch
from lightning_fabric.plugins.io.torch_io import TorchCheckpointIO

from tuneup import TuneupError
from tuneup.trainer.state import sharded
from tuneup.trainer.state.progress import progress

log = logging.getLogger(__name__)

SUFFIX = ".ckpt"
#: The best-by-metric checkpoint: kept apart, never pruned, not a resume=auto candidate.
BEST = "best.ckpt"
#: Where damaged checkpoints are moved, inside the checkpoint directory (:func:`set_aside`).
DAMAGED = "damaged"
_TEMP_PREFIX = "."
_TEMP_MARK = ".tmp-"
#: The zip archive's comment that carries the checksum: this prefix, then 64 hex digits.
SEAL = b"tuneup-sha256:"
SEAL_SIZE = len(SEAL) + 64
#: The zip "end of central directory" record: its signature, its size without the comment,
#: and where its 2-byte comment length sits in it.
_EOCD, _EOCD_SIZE, _COMMENT_LENGTH = b"PK\x05\x06", 22, slice(20, 22)


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
        if len(view) >= _EOCD_SIZE:
            self._emit(self.held)
            self._emit(view[:-_EOCD_SIZE])
            self.held = bytes(view[-_EOCD_SIZE:])
        else:
            joined = self.held + bytes(view)
            self._emit(joined[:-_EOCD_SIZE])
            self.held = joined[-_EOCD_SIZE:]
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
        if len(end) != _EOCD_SIZE or end[:4] != _EOCD or end[_COMMENT_LENGTH] != b"\0\0":
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


def remove_leftover_temporaries(directory: Path) -> list[Path]:
    """Delete temporary files of saves that were killed mid-write (they are never checkpoints)."""
    found = [p for p in Path(directory).glob(f"{_TEMP_PREFIX}*{SUFFIX}{_TEMP_MARK}*")]
    found += sharded.leftovers(Path(directory)) if Path(directory).is_dir() else []
    for path in found:
        sharded.remove(path)
    return found


# --------------------------------------------------------------------------------------
# reading
# --------------------------------------------------------------------------------------


def recorded_checksum(path: Path) -> str | None:
    """The SHA-256 the file was sealed with (hex), or None when it carries none."""
    size = path.stat().st_size
    if size < _EOCD_SIZE + SEAL_SIZE:
        return None
    with open(path, "rb") as f:
        f.seek(size - _EOCD_SIZE - SEAL_SIZE)
        tail = f.read()
    end, comment = tail[:_EOCD_SIZE], tail[_EOCD_SIZE:]
    length = int.from_bytes(end[_COMMENT_LENGTH], "little")
    if end[:4] != _EOCD or length != SEAL_SIZE or not comment.startswith(SEAL):
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


def verify(path: Path) -> None:
    """Raise :class:`UnreadableCheckpoint` when the file's bytes are not those it was sealed
    with; warn (once per file) when it carries no checksum to compare with. A directory
    (a sharded checkpoint) is checked file by file against its manifest."""
    if sharded.is_sharded(path):
        return sharded.verify(Path(path))
    expected = recorded_checksum(path)
    if expected is None:
        if str(path) not in _unsealed_warned:
            _unsealed_warned.add(str(path))
            log.warning("%s carries no checksum (written by another tool or an older tuneup); "
                        "its bytes cannot be verified", path)  # fmt: skip
        return
    actual = actual_checksum(path)
    if actual != expected:
        raise UnreadableCheckpoint(
            f"{path} is corrupt: its bytes do not match the SHA-256 it was written with "
            f"(recorded {expected[:12]}..., found {actual[:12]}...); damaged on disk or in a copy"
        )


def load(path: str | Path, map_location="cpu", mmap: bool = False, verify_checksum: bool = True):
    """Read a checkpoint with ``torch.load(weights_only=True)``; never anything less safe.

    The checksum is verified first (reading the whole file) unless ``verify_checksum=False``;
    ``mmap=True`` maps tensor data instead of reading it. Raises :class:`UnsafeCheckpoint`
    or :class:`UnreadableCheckpoint`, each naming the file.
    """
    path = Path(path)
    if sharded.is_sharded(path):  # its tensors stay on disk: shapes only (sharded.load_meta)
        return sharded.load_meta(path, verify_checksum)
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
        verify(path)
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


def checkpoint_files(directory: str | Path) -> list[Path]:
    """The resume candidates in ``directory`` by name, unread: files, and directories (sharded
    checkpoints). ``best.ckpt`` is a copy for the user, not where training stopped, so it is
    left out."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.glob(f"*{SUFFIX}")
                  if p.name != BEST and not p.name.startswith(_TEMP_PREFIX))  # fmt: skip


@dataclass
class Candidate:
    """A checkpoint file and what reading it (without the checksum) found."""

    path: Path
    contents: dict | None = None  # tensors memory-mapped
    problem: TuneupError | None = None  # UnreadableCheckpoint or UnsafeCheckpoint

    @property
    def progress(self) -> tuple[int, int, int]:
        return progress(self.contents) if self.contents is not None else (-1, -1, -1)


def scan(directory: str | Path) -> list[Candidate]:
    """Every candidate in ``directory``, newest first by the progress recorded in it (name
    breaks ties); the files that cannot be read, each with its problem, come last."""
    found = []
    for path in checkpoint_files(directory):
        try:
            found.append(Candidate(path, load(path, mmap=True, verify_checksum=False)))
        except (UnreadableCheckpoint, UnsafeCheckpoint) as exc:
            found.append(Candidate(path, problem=exc))
    return sorted(found, key=lambda c: (c.progress, c.path.name), reverse=True)


def list_checkpoints(directory: str | Path) -> list[Path]:
    """The readable checkpoints in ``directory``, newest (furthest trained) first."""
    return [c.path for c in scan(directory) if c.problem is None]


def newest_valid(directory: str | Path) -> tuple[Path, dict] | None:
    """The newest checkpoint in ``directory`` that reads and matches its checksum, with its
    contents (tensors memory-mapped).

    Each file that cannot be read, or whose bytes fail their checksum, is skipped with a
    warning naming it; none is deleted. An unsafe file anywhere in the directory is never
    skipped (someone put it there): :class:`UnsafeCheckpoint` is raised. Returns None when
    the directory holds no checkpoint at all; raises :class:`UnreadableCheckpoint` when it
    holds some but none is good.
    """
    candidates = scan(directory)
    for candidate in candidates:
        if isinstance(candidate.problem, UnsafeCheckpoint):
            raise candidate.problem
        if candidate.problem is not None:  # its progress is unknown: name it whatever it was
            log.warning("skipping a bad checkpoint: %s", candidate.problem)
    for candidate in candidates:
        if candidate.problem is not None:
            continue
        try:
            verify(candidate.path)
            return candidate.path, candidate.contents
        except UnreadableCheckpoint as exc:
            log.warning("skipping a bad checkpoint: %s", exc)
    if candidates:
        raise UnreadableCheckpoint(
            f"none of the {len(candidates)} checkpoint(s) in {directory} can be read "
            f"(e.g. {candidates[0].path.name}); not starting from scratch. Start a fresh run "
            "in another directory (hydra.run.dir=...), or resume=<path> a good copy"
        )
    return None


def prune(directory: str | Path, keep: int, protect: str | Path | None = None) -> list[Path]:
    """Delete all but the ``keep`` furthest-trained checkpoints, never ``protect`` (the one a
    run resumed from); return what was deleted.

    Files that cannot be read are set aside (:func:`set_aside`), not deleted and not counted:
    their progress is unknown, and a damaged file is evidence for whoever looks into it."""
    candidates = scan(directory)
    for candidate in candidates:
        if candidate.problem is not None:
            set_aside(candidate.path)
    readable = [c.path for c in candidates if c.problem is None]
    kept = {Path(protect).resolve()} if protect is not None else set()
    doomed = [p for p in readable[keep:] if p.resolve() not in kept]
    for path in doomed:
        sharded.remove(path)
    return doomed


def set_aside(path: str | Path) -> Path:
    """Move a damaged checkpoint (a file, or a sharded checkpoint's directory) into
    ``damaged/`` beside it, under a name none there has yet; return where it went."""
    path = Path(path)
    folder = path.parent / DAMAGED
    folder.mkdir(exist_ok=True)
    target, n = folder / path.name, 1
    while target.exists():
        target, n = folder / f"{path.stem}-{n}{path.suffix}", n + 1
    os.replace(path, target)
    fsync_directory(path.parent)
    log.warning("set aside the damaged checkpoint %s as %s: kept, never resumed, counted or "
                "pruned", path.name, target)  # fmt: skip
    return target


def set_aside_skipped(directory: str | Path, resumed: str | Path) -> list[Path]:
    """After resume=auto chose ``resumed`` (:func:`newest_valid`): set aside what it skipped,
    the files that cannot be read and those further trained than ``resumed`` (their bytes
    failed their checksum); return where they went."""
    candidates = scan(directory)
    chosen = [i for i, c in enumerate(candidates) if c.path.resolve() == Path(resumed).resolve()]
    if not chosen:
        return []  # resumed from elsewhere: this directory's files were not judged
    skipped = [c for i, c in enumerate(candidates) if i < chosen[0] or c.problem is not None]
    return [set_aside(c.path) for c in skipped]


def damaged(directory: str | Path) -> list[Path]:
    """The checkpoints set aside in ``directory`` (by this run or an earlier one)."""
    folder = Path(directory) / DAMAGED
    return sorted(folder.iterdir()) if folder.is_dir() else []


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint reader/writer, with :func:`atomic_save` and safe :func:`load`."""

    def save_checkpoint(self, checkpoint, path, storage_options=None) -> None:
        if storage_options is not None:
            raise TypeError("AtomicCheckpointIO takes no storage_options")
        atomic_save(checkpoint, path)

    def load_checkpoint(self, path, map_location=None, weights_only=None) -> dict:
        if sharded.is_sharded(path):  # written by strategy=fsdp: reassembled in this process
            verify(Path(path))
            return sharded.full_checkpoint(Path(path))
        if not Path(path).is_file():
            raise TuneupError(f"checkpoint {path} does not exist")
        return load(path, map_location=map_location or "cpu")
