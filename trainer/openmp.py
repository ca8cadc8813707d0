"""OpenMP threads that wait briefly where other work shares the CPUs.

torch's CPU build runs its parallel ops on GNU OpenMP (libgomp). Between two parallel
regions libgomp's threads spin, by default 300,000 times, before they sleep; libgomp lowers
that to 1,000 only when one process has more threads than CPUs. It cannot see other
processes: a run with a thread per core beside other busy processes spins through their time
slices and they through its, and a step takes several times as long. On an idle machine the
long spin pays: a thread that sleeps wakes late for the next op (docs/benchmarks.md, "A CPU
that other work shares": a small GPT, idle, 1.09x the time with the short spin; beside two
runs, 0.32x).

So the ``tuneup`` command looks before torch loads libgomp: :func:`watch` (at the command's
start) and :func:`decide` (just before ``torch`` is first imported) read the busy time of
the CPUs this process may run on (``/proc/stat``) less this process's own. When other
processes kept at least half a CPU busy meanwhile, it sets ``GOMP_SPINCOUNT=1000``,
libgomp's own value for an oversubscribed process; on an idle machine it sets nothing. A ``GOMP_SPINCOUNT`` or ``OMP_WAIT_POLICY`` the
shell set is kept, and so is the decision for the whole process (a sweep decides once, at its
start). The processes the run starts inherit it. Where ``/proc/stat`` is missing (not
Linux) nothing is set; a Python program that imported torch before ``tuneup.run`` keeps its
own process's setting. PyTorch's CPU launcher (``torch.backends.xeon.run_cpu``) sets
``KMP_BLOCKTIME=1`` for Intel's OpenMP, whatever the load.

Imports nothing but the standard library (the command calls it before torch).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import MutableMapping

#: libgomp's spin count for a process with more threads than CPUs (libgomp's manual,
#: GOMP_SPINCOUNT)
SPINCOUNT = "1000"
#: The variables that say how OpenMP's threads wait; one set by the user is kept
USER_SETTINGS = ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")
#: Other processes' busy CPUs, on average over the look, from which the spin is short
SHARED_FROM = 0.5
#: The shortest look: /proc/stat counts in ticks of 10 ms
SHORTEST = 0.2
#: Why the spin count is what it is in this process, for the run's summary
VARIABLE = "TUNEUP_OPENMP_WAIT"
#: How that reason starts where the spin is short (the console's device line says so)
SHORT = "short spin"

Reading = tuple[float, float, float]  # (wall s, CPUs' busy s, this process's CPU s)


def reading() -> Reading | None:
    """Now: the wall clock, the busy seconds of the CPUs this process may run on (on a node
    shared by affinity, as Slurm shares one, other jobs' cores are not counted), this
    process's CPU seconds; None where /proc/stat cannot be read."""
    try:
        with open("/proc/stat") as stat:
            ticks = busy_ticks(stat.read(), os.sched_getaffinity(0))
    except (OSError, AttributeError, ValueError, IndexError):
        return None
    times = os.times()
    return time.monotonic(), ticks / os.sysconf("SC_CLK_TCK"), times.user + times.system


def busy_ticks(stat: str, cpus: set[int]) -> int:
    """The busy ticks of ``cpus`` in /proc/stat's text (their ``cpuN`` lines): user to
    steal, less idle and iowait (guest time is counted in user already)."""
    busy = 0
    for line in stat.splitlines():
        fields = line.split()
        name = fields[0] if fields else ""
        if name[:3] == "cpu" and name[3:].isdigit() and int(name[3:]) in cpus:
            ticks = [int(v) for v in fields[1:9]]
            busy += sum(ticks) - ticks[3] - (ticks[4] if len(ticks) > 4 else 0)
    return busy


def others_busy(start: Reading, end: Reading) -> float:
    """Other processes' busy CPUs, on average between two readings."""
    wall = end[0] - start[0]
    if wall <= 0:
        return 0.0
    return max(0.0, ((end[1] - start[1]) - (end[2] - start[2])) / wall)


def wait_briefly(busy: float, environ: MutableMapping[str, str] = os.environ) -> bool:
    """``GOMP_SPINCOUNT=1000`` in ``environ`` where others kept ``busy`` CPUs busy, at least
    :data:`SHARED_FROM`, unless ``environ`` says how OpenMP's threads wait already; whether it
    was set (:data:`VARIABLE` then says why, either way)."""
    if any(environ.get(name) for name in USER_SETTINGS):
        return False
    shared = busy >= SHARED_FROM
    if shared:
        environ["GOMP_SPINCOUNT"] = SPINCOUNT
    environ[VARIABLE] = (
        f"{f'{SHORT} (GOMP_SPINCOUNT={SPINCOUNT})' if shared else 'libgomp default'}: "
        f"{busy:.1f} CPU(s) busy with other work when the command started"
    )
    return shared


class _BeforeTorch:
    """A finder first on ``sys.meta_path`` that decides as ``torch`` is first imported; it
    finds nothing itself, and stays on the path, inert (the import system is walking the path
    when it is asked: leaving would make it skip the next finder)."""

    def __init__(self, start: Reading):
        self.start: Reading | None = start

    def find_spec(self, name, path=None, target=None):
        if name == "torch" and self.start is not None:
            decide(self)
        return None


def watch() -> None:
    """Starts the look (at the command's start): decided when torch is first imported."""
    if "torch" in sys.modules:
        return
    own = [f"{name}={os.environ[name]}" for name in USER_SETTINGS if os.environ.get(name)]
    if own:
        os.environ[VARIABLE] = f"the environment's own: {' '.join(own)}"
        return
    start = reading()
    if start is not None:
        sys.meta_path.insert(0, _BeforeTorch(start))


def decide(finder: _BeforeTorch) -> None:
    """The look ends (at least :data:`SHORTEST` after it began) and the spin count is set."""
    start, finder.start = finder.start, None
    time.sleep(max(0.0, SHORTEST - (time.monotonic() - start[0])))
    end = reading()
    if end is not None:
        wait_briefly(others_busy(start, end))
