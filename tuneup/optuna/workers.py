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

Both sweepers drive their studies here: ``hparams_search=optuna`` (``hydra.sweeper.n_jobs``) and
the autotune's time-to-target study (``autotune.workers``), whose ``ask`` also stops the study
(its budget) and whose jobs take a worker's own threads or device (:class:`Slots`).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from optuna.exceptions import UpdateFinishedTrialError

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
    ask: Callable[[], tuple[object, object] | None],
    launch: Callable[[int, object], object],
    tell: Callable[[object, object], bool],
    max_failure_rate: float,
) -> None:
    """Keep up to ``workers`` trials running until the study has ``n_trials`` finished ones.

    ``ask()`` gives a new trial and its job (the overrides), ``(trial, None)`` for a trial it
    told already without a job (one the checks refuse), or None: no more trials (a budget
    spent; the running ones are waited for and told). ``launch(number, job)`` runs the job and
    gives its outcome (a run directory); ``tell(trial, outcome)`` tells the study and says
    whether the trial failed. Once more than ``max_failure_rate`` of this sweep's finished trials have
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
            asked = ask()
            if asked is None:
                stopped = True
                break
            trial, overrides = asked
            if overrides is None:  # told already: nothing to launch
                continue
            running[trial.number] = trial
            _start(launch, trial.number, overrides, ended, inline=workers == 1)
        if not running:
            break
        number, run_dir, exc = ended.get()
        trial = running.pop(number)
        if exc is not None:
            error = error or exc
            continue
        try:
            failed += tell(trial, run_dir)
        except UpdateFinishedTrialError:  # failed by a sweeper that took this one for lost
            log.warning(
                "optuna: trial %d was failed by another sweeper of the study while it ran "
                "(this sweeper's heartbeat was late: liveness.py); its result is dropped",
                number,
            )
            continue
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


def _start(launch, number: int, overrides, ended, *, inline: bool) -> None:
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


class Slots:
    """The workers' own resources: a job takes a free slot (0 .. workers-1) for as long as it
    runs, so that two jobs at once never share one (a device, a share of the cores)."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._free: queue.SimpleQueue = queue.SimpleQueue()
        for slot in range(workers):
            self._free.put(slot)

    @contextmanager
    def take(self) -> Iterator[int]:
        slot = self._free.get()
        try:
            yield slot
        finally:
            self._free.put(slot)
