"""A throwaway PostgreSQL server for tests, from Debian's ``postgresql`` package.

``python -m tests.postgres`` starts one, prints its URL and waits (Ctrl-C or SIGTERM stops it); tests use
:func:`running_server`. Everything lives in a scratch folder: the cluster ``initdb`` makes, the
log, the unix socket. The server listens on 127.0.0.1 on a free port, lets its one user in
without a password (``trust``: nothing but this machine reaches it) and writes nothing it need
not (``fsync=off``: a test's database is thrown away). It is stopped with ``pg_ctl stop`` on its
own data folder, which signals the pid that server wrote there, never a process by name.

PostgreSQL refuses to run as root: as root the server runs as the ``postgres`` user the package
creates (``runuser``), owner of the scratch folder. :func:`unavailable` says why a machine
cannot start one (.ci/run installs the package where it is root).
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

#: The server's one user and the database the tests get.
USER, DATABASE = "tuneup", "tuneup"
#: The server's user when the tests run as root.
SYSTEM_USER = "postgres"
#: Settings for a server whose data is thrown away: no waiting on the disk.
FAST = "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"


def bindir() -> Path | None:
    """The folder of ``initdb`` and ``pg_ctl``: Debian's /usr/lib/postgresql/<version>/bin
    (the newest version), else wherever PATH finds ``pg_ctl``."""
    versions = sorted(
        (p for p in Path("/usr/lib/postgresql").glob("*/bin") if (p / "pg_ctl").exists()),
        key=lambda p: [int(n) for n in re.findall(r"\d+", p.parent.name)],
    )
    if versions:
        return versions[-1]
    found = shutil.which("pg_ctl")
    return Path(found).resolve().parent if found else None


def unavailable() -> str | None:
    """Why this machine cannot start a test server, or None when it can."""
    if bindir() is None:
        return (
            "PostgreSQL is not installed (no pg_ctl under /usr/lib/postgresql/*/bin or on "
            "PATH): apt-get install postgresql"
        )
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(SYSTEM_USER)
        except KeyError:
            return (
                f"root, and no user '{SYSTEM_USER}' to run the server as (PostgreSQL "
                "refuses to run as root; Debian's postgresql package creates the user)"
            )
        if shutil.which("runuser") is None:
            return f"root, and no runuser to run the server as '{SYSTEM_USER}'"
    try:
        import psycopg  # noqa: F401  (SQLAlchemy's postgresql+psycopg:// driver)
    except ImportError:
        return "the driver psycopg is not installed: pip install 'tuneup[postgres]'"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One server: :meth:`start` makes the cluster and starts it, :meth:`stop` stops it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.data = root / "data"
        self.port = _free_port()
        self.bin = bindir()
        self.as_user = ["runuser", "-u", SYSTEM_USER, "--"] if os.geteuid() == 0 else []

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://{USER}@127.0.0.1:{self.port}/{DATABASE}"

    def _run(self, name: str, *args: str) -> None:
        done = subprocess.run(
            [*self.as_user, str(self.bin / name), *args],
            capture_output=True,
            text=True,
            cwd=self.root,
        )
        if done.returncode:
            raise RuntimeError(
                f"{name} {' '.join(args)} exited {done.returncode}:\n"
                f"{done.stdout}{done.stderr}{self.log()}"
            )

    def start(self) -> None:
        if self.as_user:  # the server's user owns its folder (a temporary folder is root's, 0700)
            shutil.chown(self.root, SYSTEM_USER)
        self._run(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            USER,
            "--auth=trust",
            "--no-sync",
            "--no-instructions",
            "-E",
            "UTF8",
        )
        options = f"-h 127.0.0.1 -p {self.port} -k {self.root} {FAST}"
        self._run(
            "pg_ctl",
            "-D",
            str(self.data),
            "-l",
            str(self.root / "server.log"),
            "-o",
            options,
            "-w",
            "-t",
            "60",
            "start",
        )
        self._run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", USER, DATABASE)

    def stop(self) -> None:
        """Stop this server (pg_ctl signals the pid in its data folder), if it runs: at once,
        without the checkpoint a database that is kept would need."""
        pid_file = self.data / "postmaster.pid"
        if not pid_file.exists():
            return
        pid = int(pid_file.read_text().split()[0])
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "-t", "60", "stop")
        for _ in range(100):  # pg_ctl returns once the pid file is gone: the process ends after
            if _ended(pid):
                return
            time.sleep(0.05)

    def log(self) -> str:
        path = self.root / "server.log"
        return f"\n--- server.log\n{path.read_text()[-3000:]}" if path.exists() else ""


def _ended(pid: int) -> bool:
    """The process is gone, or a zombie: it ran to its end (its parent, pg_ctl, is gone, and
    whoever inherited it reaps it in its own time)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True


@contextmanager
def running_server() -> Iterator[Server]:
    """A server for the block, stopped and removed after it."""
    root = Path(tempfile.mkdtemp(prefix="tuneup-pg-"))  # short: the socket's path has a limit
    server = Server(root)
    try:
        server.start()
        yield server
    finally:
        try:
            server.stop()
        finally:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    reason = unavailable()
    if reason:
        sys.exit(f"cannot start a PostgreSQL server: {reason}")
    for stop in (signal.SIGINT, signal.SIGTERM):  # also where a shell's `&` ignores Ctrl-C
        signal.signal(stop, signal.default_int_handler)
    with running_server() as server:
        print(server.url, flush=True)
        with suppress(KeyboardInterrupt):
            signal.pause()
