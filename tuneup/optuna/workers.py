"""The Optuna sweeper's workers: up to ``hydra.sweeper.n_jobs`` trials in flight, and a new
trial asked as soon as one ends (complete, pruned or failed), until the study has ``n_trials``
finished trials. No batch waits for its slowest trial, so a worker whose trial was pruned
early starts the next one at once (what Optuna's asynchronous pruners and
``TPESampler(constant_liar=True)`` are made for).

Hydra's ``Launcher.launch(job_overrides, initial_job_idx)`` runs a batch of jobs and returns
when the last one ends. Each worker is therefore a thread that launches a batch of one job,
the trial's, with the trial's number as its job number (``hydra.job.num``, its directory
under the sweep directory): numbers are unique, whatever order the trials end in. The
launchers that run jobs out of this process take concurrent ``launch`` calls: joblib's (each
call hands its job to the process-wide loky executor, whose workers run it) and submitit's
(each call submits a job array of its own and polls it; Slurm or local). The basic launcher
runs its jobs inside this process, one at a time: with it one trial runs at a time, in the
main thread, as does a joblib launcher whose ``n_jobs`` is 1. Optuna's study is asked and told
from the sweeping thread only; the threads only launch.

The threads are daemons: Ctrl-C stops the sweep at once, as it stops a single launch; the
trials then running stay RUNNING in the storage, and the next sweep on the study fails them
and runs their values again (tuneup/optuna/study.py :func:`recover_interrupted`).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from pathlib import Path

from tuneup.optuna.study import finished

log = logging.getLogger(__name__)


def worker_count(launcher, n_jobs: int) -> int:
    """How many trials run at once: ``n_jobs``, or fewer where the launcher runs fewer jobs
    at once (the log says why)."""
    limit, why = launcher_limit(launcher)
    if limit is None or limit >= n_jobs:
        return n_jobs
    log.info("optuna: hydra.sweeper.n_jobs=%d, but %s: %d trial(s) at a time", n_jobs, why, limit)
    return max(limit, 1)


def launcher_limit(launcher) -> tuple[int | None, str]:
    """The jobs ``launcher`` runs at once (None: no limit known) and why."""
    from hydra._internal.core_plugins.basic_launcher import BasicLauncher

    if isinstance(launcher, BasicLauncher):
        return 1, "the basic launcher runs its jobs in this process, one at a time"
    settings = getattr(launcher, "joblib", None)
    if type(launcher).__module__.startswith("hydra_plugins.hydra_joblib_launcher") and settings:
        from joblib import effective_n_jobs

        given = settings.get("n_jobs")
        at_once = effective_n_jobs(given)
        return (
            at_once,
            f"the joblib launcher runs {at_once} job(s) at once (hydra.launcher.n_jobs={given})",
        )
    return None, ""


def run_trials(
    study,
    *,
    workers: int,
    n_trials: int,
    ask: Callable[[], tuple[object, list[str]]],
    launch: Callable[[int, list[str]], Path],
    tell: Callable[[object, Path], bool],
    max_failure_rate: float,
) -> None:
    """Keep up to ``workers`` trials running until the study has ``n_trials`` finished ones.

    ``ask()`` gives a new trial and its job's overrides; ``launch(number, overrides)`` runs the
    job and gives its run directory; ``tell(trial, run_dir)`` tells the study and says whether
    the trial failed. Once more than ``max_failure_rate`` of this sweep's finished trials have
    failed, no trial is asked; the running ones are waited for and told. A launch that raises
    (the launcher's own error, not a failed run) stops asking too, and is raised once the
    running trials are told."""
    ended: queue.SimpleQueue = queue.SimpleQueue()
    running: dict[int, object] = {}
    told = failed = 0
    stopped, error = False, None
    while True:
        while (
            not stopped
            and error is None
            and len(running) < workers
            and n_trials - len(finished(study)) - len(running) > 0
        ):
            trial, overrides = ask()
            running[trial.number] = trial
            _start(launch, trial.number, overrides, ended, inline=workers == 1)
        if not running:
            break
        number, run_dir, exc = ended.get()
        trial = running.pop(number)
        if exc is not None:
            error = error or exc
            continue
        failed += tell(trial, run_dir)
        told += 1
        if not stopped and failed / told > max_failure_rate:
            log.error(
                "optuna: %d of %d trials failed, more than max_failure_rate=%g: no more "
                "trials are asked",
                failed,
                told,
                max_failure_rate,
            )
            stopped = True
    if error is not None:
        raise error


def _start(launch, number: int, overrides: list[str], ended, *, inline: bool) -> None:
    """Launch trial ``number``'s job: in this thread when it is the only worker (the basic
    launcher runs the job in this process, which may set signal handlers: main thread only),
    else in a daemon thread of its own; its outcome goes to ``ended``."""

    def run() -> None:
        try:
            ended.put((number, launch(number, overrides), None))
        except BaseException as exc:  # the launcher's error: raised by run_trials, after the others
            ended.put((number, None, exc))

    if inline:
        run()
    else:
        threading.Thread(target=run, name=f"tuneup-trial-{number}", daemon=True).start()
