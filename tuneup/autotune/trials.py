"""Trials: the short runs the autotune compares, each an ordinary job of the sweep.

A trial is the user's command plus the trial settings below plus a candidate's overrides,
launched through the sweep's Hydra launcher, so it runs wherever the user's jobs run
(basic: in this process; joblib: a worker process; Slurm: a batch job) and leaves what
every sweep job leaves: its directory with summary.json and .hydra/overrides.yaml, from
which it can be run again as it is.

The throughput objective launches its trials one at a time, under every launcher. Two
trials at once (joblib's ``n_jobs`` > 1) would share the cores, and each one's speed would
measure the other's load, not its own configuration. The time-to-target study's explore and
confirm stages launch up to ``autotune.workers`` at once (study/workers.py), from threads:
each launch takes its own job number. Repeats are separate trials rather than one job that
switches configurations: Lightning's fit loop holds one model, precision and compiled
graph per process, so switching inside a job would mean a checkpoint and a rebuild per
window. In the basic launcher's process a trial costs its build besides its steps; process
start-up is paid once.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from tuneup.report.runs import Run
from tuneup.stats.interval import trial_speed
from tuneup.trainer import summary as run_summary

#: The user's command as a trial's label: every stage runs it beside its candidates.
BASELINE = "baseline"


def label(overrides: tuple[str, ...]) -> str:
    """A configuration's name in the trials, the answer and the console: its overrides."""
    return " ".join(overrides) or BASELINE


def trial_settings(steps: int, limit_s: float | None = None) -> list[str]:
    """What makes a run a trial: a fixed number of steps, nothing but training in them, and
    at most ``limit_s`` seconds of it (Lightning's max_time: the trial stops after the step
    that passes it and is measured on the steps it ran)."""
    found = [
        f"trainer.max_steps={steps}",
        "trainer.max_epochs=-1",
        "++trainer.limit_val_batches=0",  # no validation: steps and their loss only
        "checkpoint=off",
        "trainer.enable_progress_bar=false",
        "measure.console_table=false",  # dozens of trials: one line each (summary.json has it)
    ]
    if limit_s is not None:
        found.append(max_time(limit_s))
    return found


def max_time(limit_s: float) -> str:
    """Lightning's ``trainer.max_time`` (whole seconds, rounded up) as an override."""
    minutes, seconds = divmod(math.ceil(limit_s), 60)
    hours, minutes = divmod(minutes, 60)
    return f"++trainer.max_time=00:{hours:02d}:{minutes:02d}:{seconds:02d}"


@dataclass
class Trial:
    label: str  # the configuration: "baseline", or the overrides that set it apart
    overrides: tuple[str, ...]  # on top of the user's command
    job: str  # the job's number: its directory under the sweep directory
    directory: Path
    summary: dict | None
    seconds: float  # wall time of the launch, the trial's start-up included
    worker: str = ""  # the worker's share of the machine ("1 thread(s)", "GPU 1"); "": all of it
    started: float = 0.0  # time.time() at its launch
    killed: bool = False  # its process died under it (:func:`was_killed`)

    @property
    def ok(self) -> bool:
        return bool(self.summary) and self.summary.get("status") == "ok"

    @property
    def error(self) -> str:
        run = Run(self.job, self.directory, list(self.overrides), self.summary)
        return run.error_line or run.status

    @property
    def speed(self) -> float | None:
        """The trial's speed for comparisons: its fastest window (see interval.trial_speed)."""
        return trial_speed(self.summary) if self.ok else None

    @property
    def steps(self) -> int | None:
        return self.figure("steps")

    def figure(self, key: str):
        return (self.summary or {}).get(key)


class Lab:
    """Launches trials through the sweep's launcher and reads their summaries; launches from
    several threads at once each take a job number of their own."""

    def __init__(
        self, launcher, sweep_dir: Path, command: list[str], steps: int, first_job: int = 0
    ) -> None:
        self.launcher = launcher
        self.first_job = first_job  # a continued search: after the killed one's job folders
        self.sweep_dir = Path(sweep_dir)
        self.command = list(command)  # the user's overrides, as given to the sweep
        self.steps = steps
        self.trials: list[Trial] = []
        self._next_job = first_job
        self.alone: tuple[list[str], str] = ([], "")  # a run without a worker's share: all of it
        self._lock = threading.Lock()  # launches from several threads (autotune.workers)

    def run(
        self,
        label: str,
        overrides: tuple[str, ...],
        steps: int | None = None,
        limit_s=None,
        settings: list[str] | None = None,
        worker: tuple[list[str], str] | None = None,
    ) -> Trial:
        """``settings``: what makes the run a trial, if not :func:`trial_settings` (a race's);
        ``worker``: the overrides that give it its worker's share of the machine, and those in
        words (None: :attr:`alone`, the machine to itself). A launch that ends without the job's final summary.json (its process killed)
        gives a trial that did not finish; the launcher's other errors are raised."""
        with self._lock:
            job, self._next_job = self._next_job, self._next_job + 1
        worker = self.alone if worker is None else worker
        own = trial_settings(steps or self.steps, limit_s) if settings is None else settings
        line = [*self.command, *own, *overrides, *worker[0]]
        started, clock = time.monotonic(), time.time()
        killed = False
        try:
            [returned] = self.launcher.launch([line], initial_job_idx=job)
        except Exception:
            if not was_killed(self.sweep_dir / str(job)):
                raise
            returned, killed = None, True  # its process died under it
        seconds = time.monotonic() - started
        directory = _output_dir(returned, self.sweep_dir / str(job))
        found = (directory / run_summary.FILE_NAME).is_file()
        summary = run_summary.read(directory) if found else None
        trial = Trial(
            label, tuple(overrides), str(job), directory, summary, seconds, worker[1], clock, killed
        )
        with self._lock:
            self.trials.append(trial)
        return trial


def was_killed(directory: Path) -> bool:
    """Whether the job in ``directory`` started (Hydra wrote its ``.hydra`` folder) and ended
    without its final summary.json, which every run writes as it ends, failed or not: a
    process killed (SIGKILL, a lost node) leaves none, or one still ``running``."""
    if not (directory / ".hydra").is_dir():
        return False  # the job never started: the launcher's own error
    try:
        return run_summary.read(directory).get("status") == "running"
    except (OSError, ValueError):  # none, or half written
        return True


def _output_dir(returned, default: Path) -> Path:
    try:
        return Path(returned.hydra_cfg.hydra.runtime.output_dir)
    except AttributeError:  # a launcher that returns no Hydra config
        return default
