"""Whether a sweeper is alive, on this host or another: a heartbeat in the study's storage.

A sweeper asks and tells its study's trials; the trials themselves run as jobs in other
processes (joblib workers, Slurm jobs), so a trial RUNNING in the storage is alive exactly
as long as the sweeper that will tell it. On this host a sweeper ``host:pid`` is gone when
its process is. On another host nothing can be asked of the process, so each sweeper keeps a
timestamp in the study's user attributes (``tuneup_alive:<host:pid>``: ``{"at", "host"}``),
written every :data:`HEARTBEAT_S` seconds by a daemon thread (:class:`Heartbeat`); one older
than :data:`STALE_S` is a lost sweeper (its node lost, its process killed). A sweeper that
stops writes ``"ended": true``: it tells no more trials and answers no more.

Why not Optuna's own heartbeat (``RDBStorage(heartbeat_interval=..., grace_period=...)``,
``fail_stale_trials``): it is kept per trial by the process that runs ``study.optimize``,
which here is no process (the sweeper asks, the jobs run), and JournalStorage, the default
storage and the one a shared file system carries, has none. The sweeper is the unit that
dies with its host and owns its trials (``tuneup_sweeper``), so one timestamp per sweeper
covers every storage and every trial it launched.

Clocks: the timestamp is the writer's wall clock, read on another host, so :data:`STALE_S`
is generous (two minutes: a Slurm node lost is noticed in minutes, clocks kept by NTP differ
by far less). A sweeper with no heartbeat recorded (a study written by an older tuneup) is
never taken for lost on another host: its trials are left to it, as before.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time

log = logging.getLogger(__name__)

#: The study's user attribute of sweeper ``host:pid``'s heartbeat: ALIVE + "host:pid".
ALIVE = "tuneup_alive:"
#: Seconds between two heartbeats of a sweeper.
HEARTBEAT_S = 10.0
#: A sweeper on another host whose heartbeat is older than this is lost.
STALE_S = 120.0


def sweeper_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def is_gone(owner: str | None, attrs: dict | None = None, now: float | None = None) -> bool:
    """Whether the sweeper ``host:pid`` will tell no more trials: on this host, its process
    is dead (or it is this process: a trial of an earlier sweep in it); on another host, its
    heartbeat in the study's user attributes ``attrs`` has ended or is stale at ``now``."""
    if not owner or ":" not in owner:
        return True  # no owner recorded: not started by a tuneup sweeper that is alive
    host, pid = owner.rsplit(":", 1)
    if host != socket.gethostname():
        return ended(owner, attrs) or lost(owner, attrs, now)
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except (PermissionError, ValueError):
        return False
    return int(pid) == os.getpid()  # this process: a trial of an earlier sweep in it


def ended(owner: str, attrs: dict | None) -> bool:
    """Whether sweeper ``owner`` stopped (it says so in its heartbeat)."""
    return bool(((attrs or {}).get(ALIVE + owner) or {}).get("ended"))


def lost(owner: str, attrs: dict | None, now: float | None = None) -> bool:
    """Whether sweeper ``owner`` is lost: its heartbeat, not ended, older than
    :data:`STALE_S` at ``now`` (no heartbeat recorded: not known to be lost)."""
    beat = (attrs or {}).get(ALIVE + owner)
    if not beat or beat.get("ended"):
        return False
    return (time.time() if now is None else now) - float(beat["at"]) > STALE_S


def beat(study, me: str, now: float | None = None, end: bool = False) -> None:
    """Record sweeper ``me``'s heartbeat in ``study`` (``end``: it stops)."""
    record = {"at": time.time() if now is None else now, "host": socket.gethostname()}
    study.set_user_attr(ALIVE + me, {**record, "ended": True} if end else record)


class Heartbeat:
    """Sweeper ``me``'s heartbeat in ``study`` while the ``with`` block runs, every
    :data:`HEARTBEAT_S` seconds from a daemon thread (it dies with the process: a killed
    sweeper's heartbeat goes stale); on leaving the block, ``ended``."""

    def __init__(self, study, me: str, interval_s: float = HEARTBEAT_S) -> None:
        self.study, self.me, self.interval_s = study, me, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tuneup-heartbeat", daemon=True)

    def __enter__(self) -> Heartbeat:
        beat(self.study, self.me)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        try:
            beat(self.study, self.me, end=True)
        except Exception as error:  # the storage gone: the heartbeat goes stale instead
            log.warning("optuna: could not record that sweeper %s ended: %s", self.me, error)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                beat(self.study, self.me)
            except Exception as error:  # a storage hiccup: the next beat tries again
                log.warning("optuna: sweeper %s's heartbeat not recorded: %s", self.me, error)
