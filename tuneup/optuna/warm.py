"""Warm workers: a joblib launcher's worker processes import what a trial imports before the
first trial asks them for it.

Under ``hydra/launcher=joblib`` every job runs in a worker process of joblib's process-wide
loky executor, which the launcher's ``Parallel(backend="loky", n_jobs=N)`` starts (N processes
at once) and reuses. A process's first job imports torch, Lightning, tuneup's run path, the
zoo and the plugins its config switches on: seconds of CPU that its later jobs do not pay.
With several trials at once the first trial of every process but the baseline's pays them in
the middle of the study, beside another worker's trial. :func:`warm` pays them once, in every
process at the same time, before the study's first job (the baseline), which then starts in
a process that has them: what the baseline's own imports took is what the warm-up takes.

It goes through the same executor the launcher's jobs get: a ``Parallel`` made with the
launcher's own arguments (its ``joblib`` settings, with the backend set to loky as the
launcher sets it), so that joblib, which reuses its executor when the arguments (the workers,
their environment, the idle timeout) are those of the last call, hands the launcher's next
``Parallel`` the processes warmed here. loky may give two tasks to one process while another
takes none, so every task waits, after its imports, until every process has one (a barrier
on files named by the processes' ids), at most until a deadline: a process that never takes
one leaves its first trial to import for itself.

A warmed process then keeps what it imported out of Python's collections (``gc.freeze``): with
psutil absent, loky's worker runs a full ``gc.collect()`` after every job that took over a
second, and a full collection walks every object the process holds (torch's, Lightning's:
hundreds of thousands), a cost that a trial run in the sweep's own process (the basic launcher)
does not pay. The freeze is made once per process, at its first warm-up; frozen objects are the
survivors of a collection made just before, so no garbage is kept; they are still freed by
reference counting, and a cycle among them that becomes garbage later stays until the process
ends (at exit they are unfrozen, so the interpreter's last collection sees them, as it would
without the freeze).

A warm-up is an optimisation: one that fails (a worker that dies, an import that raises, the
deadline) is logged and the study goes on, its first trials importing for themselves.

Under the basic launcher (its jobs run in the sweep's own process), submitit's (each job a
process of its own, started for it on the node Slurm picks) and any other there is no
process to warm before its job: :func:`warm` does nothing.
"""

from __future__ import annotations

import atexit
import gc
import importlib
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

from tuneup.process_exit import end_worker_as_command

log = logging.getLogger(__name__)

#: What a trial's job imports before it trains, by name (imported in the worker processes
#: only): torch, Lightning, the run path and the zoo's models and data sets. The plugins the
#: config switches on are loaded through the core's entry points (:func:`_load_plugins`).
MODULES = (
    "torch",
    "pytorch_lightning",
    "tuneup.trainer.runner",
    "tuneup.trainer.components",
    "tuneup.zoo.data",
    "tuneup.zoo.models",
)

#: Seconds a warm task waits, after its own imports, for every process to have one.
DEADLINE_S = 60.0


def warm(launcher, config=None, modules=MODULES, deadline_s: float = DEADLINE_S) -> list:
    """Import ``modules`` (and the plugins ``config`` switches on) in every worker process of
    a joblib ``launcher``; ``(pid, torch imported)`` of each process warmed: none where there
    is nothing to warm, or where it failed (logged)."""
    settings = joblib_settings(launcher)
    if settings is None:
        return []
    from joblib import Parallel, delayed, effective_n_jobs

    processes = effective_n_jobs(settings.get("n_jobs"))
    if processes < 2:  # joblib runs n_jobs=1 in this process
        return []
    modules = (*modules, *_task_module(launcher))
    started = time.monotonic()
    try:
        with tempfile.TemporaryDirectory(prefix="tuneup-warm-") as barrier:
            deadline = time.time() + deadline_s
            said = Parallel(**settings)(
                delayed(warm_process)(modules, config, barrier, processes, deadline)
                for _ in range(processes)
            )
    except Exception as exc:  # a process that died: the trials import for themselves
        log.warning(
            "workers: the warm-up failed (%s: %s); the first trials import for themselves",
            type(exc).__name__,
            exc,
        )
        return []
    warmed = []
    for pid, torch, error in said:
        if error:
            log.warning(
                "workers: process %d could not be warmed (%s); its first trial imports for itself",
                pid,
                error,
            )
        else:
            warmed.append((pid, torch))
    log.info(
        "workers: %d of %d joblib worker process(es) warmed (%s) in %.1f s",
        len(pids := sorted({pid for pid, _ in warmed})),
        processes,
        ", ".join(map(str, pids)),
        time.monotonic() - started,
    )
    return warmed


def joblib_settings(launcher) -> dict | None:
    """The arguments the joblib ``launcher``'s ``Parallel`` gets (its ``joblib`` settings, the
    backend loky, the counts as integers, as its ``launch`` makes them); None for another
    launcher."""
    kind = type(launcher)
    given = getattr(launcher, "joblib", None)
    if not kind.__module__.startswith("hydra_plugins.hydra_joblib_launcher") or given is None:
        return None
    from hydra_plugins.hydra_joblib_launcher._core import process_joblib_cfg

    settings = dict(given)
    settings["backend"] = "loky"  # as the launcher's launch sets it
    process_joblib_cfg(settings)
    return settings


def _task_module(launcher) -> tuple[str, ...]:
    task = getattr(launcher, "task_function", None)
    module = getattr(task, "__module__", None)
    return (module,) if module and module != "__main__" else ()


def warm_process(modules, config, barrier: str, processes: int, deadline: float):
    """In a worker process: import ``modules`` and the plugins ``config`` switches on, then
    wait until ``processes`` distinct processes have done so (files in ``barrier``) or the
    ``deadline`` (time.time()) passes; ``(pid, torch imported, the error or "")``. A process
    that has warmed already returns at once. An import that fails is said, not raised: joblib
    would stop every worker process for it, the warmed ones too."""
    end_worker_as_command()  # its end does not hold the command up (tuneup/process_exit.py)
    pid = os.getpid()
    mark = Path(barrier) / str(pid)
    if mark.exists():
        return pid, "torch" in sys.modules, ""
    error = ""
    try:
        for name in modules:
            importlib.import_module(name)
        if config is not None:
            _load_plugins(config)
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    keep_out_of_collections()
    mark.touch()
    while len(os.listdir(barrier)) < processes and time.time() < deadline:
        time.sleep(0.05)
    return pid, "torch" in sys.modules, error


def keep_out_of_collections() -> None:
    """Collect this process's garbage, then freeze what is left (the imports) out of later
    collections (module docstring); unfrozen at exit. Once per process: a warm-up of a process
    that has run jobs would freeze what the last job left (its Hydra state, whose cycles the
    next job's collection frees)."""
    if gc.get_freeze_count():
        return
    gc.collect()
    gc.freeze()
    atexit.register(gc.unfreeze)


def _load_plugins(config) -> None:
    """Import the plugins ``config`` switches on and the required ones (their modules, through
    the core's entry points; no plugin is made)."""
    from omegaconf import DictConfig, OmegaConf

    from tuneup.trainer.plugin_selection import REQUIRED, entry_points, switched_on

    cfg = config if isinstance(config, DictConfig) else OmegaConf.create(config)
    available = entry_points()
    for name in {*switched_on(cfg), *REQUIRED}:
        if name in available:
            available[name].load()
