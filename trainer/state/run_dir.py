"""One run per run directory: an exclusive lock, and the record of what ran there.

Two runs given the same ``hydra.run.dir`` would interleave their ``metrics.csv`` and keep
one ``summary.json``. The first process of a run takes an exclusive lock on
``<run dir>/.tuneup.lock`` (``fcntl.flock``) and holds it for the run: the operating system
releases it on any exit, a crash or a ``kill -9`` included, so a stale lock cannot block a
later run, and the second run is refused naming the first (its pid and host, written in
the file). A run that ends removes the file; one killed leaves it, unlocked. The other ranks of a multi-process run join the directory the first one locked.
On file systems without ``flock`` (some network mounts) the lock is the file itself,
created exclusively, and a leftover from a dead process of this host is detected by its pid.

Only once the lock is held and ``resume=`` is resolved does a run own a new directory: then
it writes Hydra's record (``.hydra/config.yaml``, ``hydra.yaml``, ``overrides.yaml``; Hydra
itself is told not to, ``hydra.output_subdir: null``) and its log file. A directory that
already holds a run (a resume, a requeued job) is owned only once training starts from it
(:class:`Claim`): a command refused before then (changed settings, the checkpoint, a
plugin's check, the data) leaves the run's record, log, summary and metrics as they were,
so that the run's own command still continues it. A run refused there touches nothing of
the run it refused.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import sys
from pathlib import Path

from hydra.experimental.callback import Callback

from tuneup.errors import TuneupError

LOCK_FILE = ".tuneup.lock"
RECORD_DIR = ".hydra"


class RunDirInUse(TuneupError):
    """Another live run holds this run directory."""


class RunDirLock:
    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / LOCK_FILE
        self.fd: int | None = None

    def acquire(self) -> RunDirLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                os.close(fd)
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise RunDirInUse(self._in_use_message()) from exc
                return self._acquire_by_creation()  # flock is not supported on this file system
            if self._is_current(fd):
                break
            os.close(fd)  # locked a file its holder removed on release: lock the new one
        self.fd = fd
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()} {socket.gethostname()}\n".encode())
        return self

    def _acquire_by_creation(self) -> RunDirLock:
        if self.path.exists() and not self._holder_alive():
            self.path.unlink()
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError as exc:
            raise RunDirInUse(self._in_use_message()) from exc
        os.write(fd, f"{os.getpid()} {socket.gethostname()}\n".encode())
        self.fd, self.created = fd, True
        return self

    def _holder_alive(self) -> bool:
        pid, host = self._holder()
        if host != socket.gethostname() or pid is None:
            return True  # another host's process: cannot tell, so it is alive
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def _holder(self) -> tuple[int | None, str | None]:
        try:
            pid, host = self.path.read_text().split()
            return int(pid), host
        except (OSError, ValueError):
            return None, None

    def _in_use_message(self) -> str:
        pid, host = self._holder()
        holder = f"process {pid} on {host}" if pid else "another process"
        return (
            f"run directory {self.path.parent} is in use by another run ({holder}); two runs "
            "in one directory would mix their metrics and checkpoints. Wait for it to end, "
            "or give this run its own directory: hydra.run.dir=<another directory>"
        )

    def _is_current(self, fd: int) -> bool:
        """Whether ``fd`` is still the file at the lock's path (a holder removes it on release)."""
        try:
            return os.stat(self.path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            return False

    def release(self) -> None:
        """Remove the lock file (a finished run leaves none), then let go of the lock: removed
        while held, so a run that opened it meanwhile sees it is gone and locks a new one."""
        if self.fd is None:
            return
        self.path.unlink(missing_ok=True)
        os.close(self.fd)  # closing releases the flock
        self.fd = None

    def __enter__(self) -> RunDirLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


#: Free space a run directory must have when a run starts: its log, metrics and summary, and
#: the first checkpoint's temporary file, begin there (checkpoint sizes: plugins/checkpoint/saver.py
#: warns when the next one will not fit).
MIN_FREE_BYTES = 4 * 2**20


def check_writable(*directories: Path) -> None:
    """Raise :class:`TuneupError` (one line) unless each existing directory can be written and
    has :data:`MIN_FREE_BYTES` free, before anything is trained (else a read-only or full
    directory was found at the first save, up to ``checkpoint.every_n_minutes`` later).

    The space is reserved for a moment (``posix_fallocate`` of a hidden file, then removed):
    the file system itself says whether it fits, quotas included; nothing is written."""
    for directory in directories:
        if not Path(directory).is_dir():
            continue
        probe = Path(directory) / f".tuneup-probe-{socket.gethostname()}-{os.getpid()}"
        try:
            fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                _reserve(fd)
            finally:
                os.close(fd)
                probe.unlink(missing_ok=True)
        except OSError as exc:
            raise TuneupError(unwritable(Path(directory), exc)) from None


def _reserve(fd: int) -> None:
    """Reserve :data:`MIN_FREE_BYTES` in ``fd``'s file; where the file system cannot reserve
    space (some FUSE and network mounts), write a few bytes: writing is checked, space not."""
    try:
        os.posix_fallocate(fd, 0, MIN_FREE_BYTES)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise
        os.write(fd, b"tuneup")


def unwritable(directory: Path, exc: OSError) -> str:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return (
            f"the run directory {directory} has less than {MIN_FREE_BYTES // 2**20} MiB free "
            f"({exc.strerror}): the run could not write its log, metrics or checkpoints. "
            "Free space, or give the run a directory on another file system: "
            "hydra.run.dir=<directory>"
        )
    return (
        f"cannot write in the run directory {directory} ({exc.strerror}): the run could not "
        "write its log, metrics or checkpoints. Give it a directory where it can write: "
        "hydra.run.dir=<directory>"
    )


def holds_a_run(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds what a run left (anything but a lock file): a new run's
    directory is empty, made by Hydra a moment ago."""
    return Path(run_dir).is_dir() and any(p.name != LOCK_FILE for p in Path(run_dir).iterdir())


class Claim:
    """When a run takes its directory: writes its record (the first process) and opens its
    log file (``log``: console.py ``RunLog``). At once in a new directory; in one that holds
    a run (``held``), only at :meth:`accept`, once training starts (the checkpoint restored and
    every check passed), so that a refused command changes nothing there."""

    def __init__(self, run_dir: Path, cfg, log, first: bool, held: bool) -> None:
        self.run_dir, self.cfg, self.log, self.first = run_dir, cfg, log, first
        self.taken = False
        #: called once, at :meth:`accept`: the runner's (the plugins' ``on_run_accepted``,
        #: where a logger makes its first record in the run directory or its store)
        self.when_accepted = None
        if not held:
            self.take()

    def accept(self) -> None:
        """The run is accepted (training starts, or ``mode``'s evaluation): it takes the
        directory, and what waited for this (:attr:`when_accepted`) runs, once."""
        self.take()
        then, self.when_accepted = self.when_accepted, None
        if then is not None:
            then()

    def take(self) -> None:
        if not self.taken:
            self.taken = True
            if self.first:
                write_record(self.run_dir, self.cfg)
            self.log.open()


def write_record(run_dir: Path, cfg) -> None:
    """Hydra's record of the run in ``<run dir>/.hydra``, as Hydra would write it."""
    from omegaconf import OmegaConf

    record = Path(run_dir) / RECORD_DIR
    record.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, record / "config.yaml")
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized():
        hydra = HydraConfig.get()
        OmegaConf.save(OmegaConf.create({"hydra": hydra}), record / "hydra.yaml")
        OmegaConf.save(hydra.overrides.task, record / "overrides.yaml")


class RunDirectoryCheck(Callback):
    """A Hydra callback: the run (or sweep) directory can be made, else one line and exit 1.

    Hydra makes the directory before the job starts and would end with its own traceback.
    """

    def on_run_start(self, config, **kwargs) -> None:
        self._check(config.hydra.run.dir, "hydra.run.dir")

    def on_multirun_start(self, config, **kwargs) -> None:
        """The sweep directory is made, then removed again: its sweeper makes it when the sweep
        starts, and a sweep refused before then (a bad option, an autotune setting) leaves no
        empty ``multirun/<date>/<time>`` behind."""
        self._check(config.hydra.sweep.dir, "hydra.sweep.dir", keep=False)

    @staticmethod
    def _check(directory: str, key: str, keep: bool = True) -> None:
        path = Path(directory)
        made = [p for p in (path, *path.parents) if not p.exists()]  # deepest first
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            print(
                f"error: cannot create the run directory {directory} ({exc.strerror}); "
                f"give one where you can write: {key}=<directory>",
                file=sys.stderr,
            )
            sys.exit(1)
        for level in [] if keep else made:
            try:
                level.rmdir()
            except OSError:  # something else is in it already: left
                break
