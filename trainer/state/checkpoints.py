"""A directory of checkpoints: names, the newest valid one, pruning, damaged files.

Order (:func:`list_checkpoints`): "newest" is the furthest training progress
recorded in a file (optimizer steps, then micro-batches, then epochs), never its
modification time, which ``cp -r``, ``rsync`` without ``-t`` or a restore from backup
rewrite: a copied run resumes from its real last step, and pruning never deletes it.

Damaged checkpoints (:func:`set_aside`): a file that cannot be read, or that resume=auto
skipped because its bytes failed their checksum, is moved into ``checkpoints/damaged/``:
kept for whoever looks into it, never a resume candidate, never counted toward
``keep_last`` and never pruned; a later save of the same step cannot overwrite it.

Superseded checkpoints (:func:`set_aside_newer`): ``resume=<path>`` of a checkpoint older
than others in the run's directory (going back to before a loss spike) trains the steps
after it again; the further-trained checkpoints are moved into ``checkpoints/superseded/``
the same way, so that the new steps neither overwrite them nor interleave with them (a
later ``resume=auto`` would pick the old timeline's newest).
"""

from __future__ import annotations

import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from tuneup.errors import TuneupError
from tuneup.trainer.state import sharded
from tuneup.trainer.state.checkpoint_read import (
    UnreadableCheckpoint,
    UnsafeCheckpoint,
    load,
    verify,
)
from tuneup.trainer.state.checkpoint_write import TEMP_MARK, TEMP_PREFIX, fsync_directory
from tuneup.trainer.state.progress import progress

log = logging.getLogger(__name__)

SUFFIX = ".ckpt"
#: The best-by-metric checkpoint: kept apart, never pruned, not a resume=auto candidate.
BEST = "best.ckpt"
#: Where damaged checkpoints are moved, inside the checkpoint directory (:func:`set_aside`).
DAMAGED = "damaged"
#: Where checkpoints further trained than one resumed with ``resume=<path>`` are moved.
SUPERSEDED = "superseded"


def checkpoint_name(epoch: int, step: int) -> str:
    """``epoch002-step00000123.ckpt``: zero-padded so names sort in training order, and free
    of ``=`` so the path can be given as ``resume=<path>`` on a Hydra command line."""
    return f"epoch{epoch:03d}-step{step:08d}{SUFFIX}"


def remove_leftover_temporaries(directory: Path) -> list[Path]:
    """Delete temporary files of saves that were killed mid-write (they are never checkpoints)."""
    found = [p for p in Path(directory).glob(f"{TEMP_PREFIX}*{SUFFIX}{TEMP_MARK}*")]
    found += sharded.leftovers(Path(directory)) if Path(directory).is_dir() else []
    for path in found:
        sharded.remove(path)
    return found


def checkpoint_files(directory: str | Path) -> list[Path]:
    """The resume candidates in ``directory`` by name, unread: files, and directories (sharded
    checkpoints). ``best.ckpt`` is a copy for the user, not where training stopped, so it is
    left out."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return sorted(
        p
        for p in directory.glob(f"*{SUFFIX}")
        if p.name != BEST and not p.name.startswith(TEMP_PREFIX)
    )


@dataclass
class Candidate:
    """A checkpoint file and what reading it (without the checksum) found."""

    path: Path
    contents: dict | None = None  # tensors memory-mapped; None where only its progress was kept
    problem: TuneupError | None = None  # UnreadableCheckpoint or UnsafeCheckpoint
    recorded: tuple[int, int, int] | None = None  # its progress, read before (see _READ)

    @property
    def progress(self) -> tuple[int, int, int]:
        if self.contents is not None:
            return progress(self.contents)
        return self.recorded if self.recorded is not None else (-1, -1, -1)


#: What reading each checkpoint file found (its progress, or its problem), by the file's
#: path, with the identity it had then (device, inode, size, times): a file is unpickled once
#: per process, not again at every save's pruning (the weights-only unpickler took 40 % of a
#: small run that saves every step). A file written anew (saves rename a new file into place)
#: or changed in place has another identity and is read again. A file pruned or set aside is
#: forgotten, so this holds the files present, not every step ever saved. Sharded
#: checkpoints (directories) are read each time: a change inside one can leave the
#: directory's own times as they were.
_READ: dict[str, tuple[tuple, tuple[int, int, int] | None, TuneupError | None]] = {}


def _identity(path: Path) -> tuple | None:
    """(device, inode, size, mtime, ctime) of a file; None for a directory or nothing there."""
    try:
        st = path.stat()
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def _forget(path: Path) -> None:
    _READ.pop(str(path.resolve()), None)


def remember_written(path: str | Path, checkpoint: dict) -> None:
    """A file this process has just written from ``checkpoint``: its progress is known
    without reading it back (the next prune's scan would otherwise unpickle it)."""
    identity = _identity(Path(path))
    if identity is not None:
        _READ[str(Path(path).resolve())] = (identity, progress(checkpoint), None)


def scan(directory: str | Path, contents: bool = True) -> list[Candidate]:
    """Every candidate in ``directory``, newest first by the progress recorded in it (name
    breaks ties); the files that cannot be read, each with its problem, come last.
    ``contents=False``: each candidate's progress and problem only, a file read before (by
    this process, unchanged since) not read again."""
    found = []
    for path in checkpoint_files(directory):
        name, identity = str(path.resolve()), _identity(path)
        known = _READ.get(name) if identity is not None else None
        if not contents and known is not None and known[0] == identity:
            found.append(Candidate(path, problem=known[2], recorded=known[1]))
            continue
        try:
            candidate = Candidate(path, load(path, mmap=True, verify_checksum=False))
        except (UnreadableCheckpoint, UnsafeCheckpoint) as exc:
            candidate = Candidate(path, problem=exc)
        if identity is not None:
            recorded = None if candidate.problem else candidate.progress
            _READ[name] = (identity, recorded, candidate.problem)
        if not contents and candidate.contents is not None:
            candidate = Candidate(path, recorded=candidate.progress)  # the mapping let go
        found.append(candidate)
    return sorted(found, key=lambda c: (c.progress, c.path.name), reverse=True)


def list_checkpoints(directory: str | Path) -> list[Path]:
    """The readable checkpoints in ``directory``, newest (furthest trained) first."""
    return [c.path for c in scan(directory, contents=False) if c.problem is None]


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


def intact_beside(path: str | Path, limit: int = 3) -> list[tuple[Path, int]]:
    """Up to ``limit`` checkpoints in the folder of ``path`` (itself left out) that read and
    match their checksums, newest first, each with its optimizer step: what a refused
    ``resume=<path>`` can continue from instead."""
    path = Path(path)
    found = []
    for candidate in scan(path.parent, contents=False):
        if len(found) == limit:
            break
        if candidate.problem is not None or candidate.path.resolve() == path.resolve():
            continue
        try:
            verify(candidate.path)
        except UnreadableCheckpoint:
            continue
        found.append((candidate.path, candidate.progress[0]))
    return found


def prune(directory: str | Path, keep: int, protect: str | Path | None = None) -> list[Path]:
    """Delete all but the ``keep`` furthest-trained checkpoints, never ``protect`` (the one a
    run resumed from); return what was deleted.

    Files that cannot be read are set aside (:func:`set_aside`), not deleted and not counted:
    their progress is unknown, and a damaged file is evidence for whoever looks into it."""
    candidates = scan(directory, contents=False)
    for candidate in candidates:
        if candidate.problem is not None:
            set_aside(candidate.path)
    readable = [c.path for c in candidates if c.problem is None]
    kept = {Path(protect).resolve()} if protect is not None else set()
    doomed = [p for p in readable[keep:] if p.resolve() not in kept]
    for path in doomed:
        _forget(path)
        sharded.remove(path)
    return doomed


def set_aside(path: str | Path, into: str = DAMAGED) -> Path:
    """Move a damaged checkpoint (a file, or a sharded checkpoint's directory) into
    ``damaged/`` beside it (or ``into``), under a name none there has yet; return where it
    went."""
    path = Path(path)
    folder = path.parent / into
    folder.mkdir(exist_ok=True)
    target, n = folder / path.name, 1
    while target.exists():
        target, n = folder / f"{path.stem}-{n}{path.suffix}", n + 1
    _forget(path)
    os.replace(path, target)
    fsync_directory(path.parent)
    if into == DAMAGED:
        log.warning(
            "set aside the damaged checkpoint %s as %s: kept, never resumed, counted or pruned",
            path.name,
            target,
        )
    return target


def set_aside_skipped(directory: str | Path, resumed: str | Path) -> list[Path]:
    """After resume=auto chose ``resumed`` (:func:`newest_valid`): set aside what it skipped,
    the files that cannot be read and those further trained than ``resumed`` (their bytes
    failed their checksum); return where they went."""
    candidates = scan(directory, contents=False)
    chosen = [i for i, c in enumerate(candidates) if c.path.resolve() == Path(resumed).resolve()]
    if not chosen:
        return []  # resumed from elsewhere: this directory's files were not judged
    skipped = [c for i, c in enumerate(candidates) if i < chosen[0] or c.problem is not None]
    return [set_aside(c.path) for c in skipped]


def set_aside_newer(directory: str | Path, resumed: str | Path) -> list[Path]:
    """After ``resume=<path>``: move the checkpoints in ``directory`` further trained than
    ``resumed`` into ``superseded/`` (kept, never resumed, counted or pruned), saying so;
    return where they went."""
    reached = progress(load(resumed, mmap=True, verify_checksum=False))
    newer = [
        c.path
        for c in scan(directory, contents=False)
        if c.problem is None and c.progress > reached
    ]
    moved = [set_aside(path, SUPERSEDED) for path in reversed(newer)]  # oldest first
    if moved:
        log.warning(
            "resuming %s, older than %d checkpoint(s) of this run (the newest: %s): moved them "
            "into %s, kept, never resumed, counted or pruned; the steps after the one resumed "
            "are trained again",
            Path(resumed).name,
            len(moved),
            newer[0].name,
            Path(directory) / SUPERSEDED,
        )
    return moved


def damaged(directory: str | Path, into: str = DAMAGED) -> list[Path]:
    """The checkpoints set aside in ``directory`` (by this run or an earlier one)."""
    folder = Path(directory) / into
    return sorted(folder.iterdir()) if folder.is_dir() else []
