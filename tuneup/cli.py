"""The ``tuneup`` command; ``python -m tuneup`` and ``python run.py`` (in a checkout) are the same.

``tuneup [group=option ...] [key=value ...]`` composes the config with Hydra (the built-in
configs, ``./conf`` or ``--config-dir``, installed plugins' configs: trainer/config.py),
and trains it (tuneup.trainer.runner). It works from any directory; Hydra's run
directories land under the current one, and the current directory is importable (as with
``python -m``), so ``model._target_=my_project.nets.Net`` finds the user's code.

``--help`` lists the groups and their choices without composing or importing torch.

Exit codes: 0 done; 1 a config or run error (one line on stderr; the full traceback in the
run's log file, and on the console too with ``HYDRA_FULL_ERROR=1``); 75 preempted after a
checkpoint (run it again to continue); 130 Ctrl-C (a checkpoint saved at the end of the step,
unless pressed twice; the line printed continues the run). What the console shows and what only the log file
keeps: trainer/console.py.
"""

from __future__ import annotations

import logging
import math
import os
import sys

from tuneup import PROJECT, TuneupError
from tuneup.crash import crash_line, rank_prefix, show_traceback_if_asked
from tuneup.mode_probe import without_needless_probe
from tuneup.process_exit import end_worker_as_command
from tuneup.usage import help_text

log = logging.getLogger(__name__)


def console() -> None:
    """The ``tuneup`` command, ``python -m tuneup`` and ``python run.py``: :func:`main`, then
    the process ends as Python would end it, less the interpreter's teardown, where a C++
    thread of the run's process group can abort a finished run (tuneup/process_exit.py).
    Ctrl-C outside a run's own handling (trainer/runner.py) is one line and exit 130 too: in a
    sweep (its sweeper setting up, between its runs, its jobs in other processes), where the
    sweep is and how to go on; before the run or the sweep started (Hydra composing), that
    nothing was trained."""
    from tuneup.process_exit import end_process

    try:
        main()
    except SystemExit as stop:
        end_process(stop.code)
    except KeyboardInterrupt:  # Ctrl-C outside a run's own handling: one line, as there
        line = interrupted_sweep() or interrupted_before_start()
        print(f"interrupted: {line}", file=sys.stderr, flush=True)
        end_process(130)
    except Exception:  # before a run's log file existed: the traceback, as Python prints it
        sys.excepthook(*sys.exc_info())
        end_process(1)
    end_process(0)


def main() -> None:
    """Help, or compose with Hydra and train; returns, or raises SystemExit with the status."""
    argv = sys.argv[1:]
    if any(a in ("-h", "--help") for a in argv):
        print(help_text(argv))
        return
    from tuneup.trainer import openmp

    openmp.watch()  # OpenMP's spin, decided before torch loads it (trainer/openmp.py)
    from tuneup import override_syntax
    from tuneup.trainer import config_folders, hints
    from tuneup.trainer.state.preemption import COMMAND_VARIABLE, command_name

    os.environ.setdefault(COMMAND_VARIABLE, command_name())  # for the processes launchers start
    config_folders.warn_shadowed(argv)
    for line in hints.repeated_presets(argv):  # Hydra would use the last one alone
        print(f"error: {line}", file=sys.stderr, flush=True)
        raise SystemExit(1)
    if line := override_syntax.problem(argv):  # Hydra's: its parser's exception and a caret
        print(f"error: {line}", file=sys.stderr, flush=True)
        raise SystemExit(1)
    from tuneup.trainer.state.saved_overrides import nothing_to_resume

    if line := nothing_to_resume(argv):  # a mistyped run directory: no default model trained
        print(f"error: {line}", file=sys.stderr, flush=True)
        raise SystemExit(1)
    argv = resumed_settings(argv)
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # the user's own modules, as `python -m tuneup` sees them
    held = _held_stderr()  # Hydra's own error, until a run starts: ours may replace it
    try:
        with without_needless_probe(argv):  # one composition, not two (tuneup/mode_probe.py)
            _hydra_main()
    except (SystemExit, Exception) as exc:  # Hydra reports its own errors, then exits 1
        if not _started and (not isinstance(exc, SystemExit) or exc.code == 1):
            try:  # a typo'd option ("Could not find") or key ("Could not override"): what was meant
                refused = held.refused_override()  # not another error (a sweeper's own line)
                meant = (hints.choice_hints(argv) or hints.override_hints(argv)) if refused else []
            except Exception:  # a hint must never hide Hydra's own message
                meant = []
            if meant:  # ours alone: Hydra's 12 lines (and its "use +key") would contradict it
                held.discard()
            held.release()
            for line in meant:
                print(f"error: {line}", file=sys.stderr, flush=True)
        raise
    finally:
        held.release()


_started = False  # whether Hydra got as far as calling task(): a config was composed
_ran = False  # whether task() called the run (its imports done)


def resumed_settings(argv: list[str]) -> list[str]:
    """A resumed run's command line with the overrides its run recorded in front (the
    command line's own win), said on the console; ``sys.argv`` too, which Hydra parses."""
    from tuneup.trainer.state.saved_overrides import announce, with_saved_overrides

    merged, record, taken = with_saved_overrides(argv)
    if taken:
        announce(record, taken)
        sys.argv[1:] = merged
    return merged


class _HeldStderr:
    """Standard error held back until a run starts (:func:`task`), then passed through: when
    Hydra refuses the command line, the command may print one line of its own instead."""

    def __init__(self, stream):
        self.stream, self.held, self.released = stream, [], False

    def write(self, text: str) -> int:
        if self.released:
            return self.stream.write(text)
        self.held.append(text)
        return len(text)

    def flush(self) -> None:
        if self.released:
            self.stream.flush()

    def discard(self) -> None:
        self.held.clear()

    def refused_override(self) -> bool:
        """Whether what is held is Hydra refusing an override of the command line: an option
        or a key it cannot find, or a ``+`` before a key that exists. Any other error (the
        autotune's ``error: autotune.objective=...``) is the one to show, with no hint."""
        text = "".join(self.held)
        return any(f"Could not {what}" in text for what in ("override", "find", "append"))

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.stream.write("".join(self.held))
            self.held.clear()
            self.stream.flush()
        if sys.stderr is self:
            sys.stderr = self.stream

    def __getattr__(self, name):  # fileno, isatty, encoding...: the real stream's
        return getattr(self.stream, name)


def _held_stderr() -> _HeldStderr:
    sys.stderr = _HeldStderr(sys.stderr)
    return sys.stderr


def _hydra_main() -> None:
    import hydra

    hydra.main(version_base="1.3", config_path=f"pkg://{PROJECT}.conf", config_name="config")(
        task
    )()


def task(cfg):
    """Train one run (one job of a sweep): a :class:`TuneupError` becomes a message and exit 1.

    A preempted run (``Preempted``: a signal, then a checkpoint) exits with 75, in a
    multirun too. In a multirun a failed run must not end the sweep: its summary.json
    already holds status "failed" and the error, so the error is logged and NaN returned.
    Were it raised, Hydra's basic sweeper would stop after the batch and skip the sweep-end
    callback that writes the report (tuneup/report/callback.py, which then exits 1 if any
    run failed); the Optuna sweeper records the NaN trial as failed.
    """
    global _started, _ran
    _started = True
    _sweep_seen()  # for Ctrl-C between this sweep's jobs, when Hydra holds no config
    end_worker_as_command()  # a joblib worker: its end does not hold the command up
    if isinstance(sys.stderr, _HeldStderr):  # a run has started: its output flows as it comes
        sys.stderr.release()
    import torch  # noqa: F401  (first, so its logger is routed before the libraries below speak)

    from tuneup.trainer import console

    console.route_libraries()
    from tuneup.trainer.runner import run
    from tuneup.trainer.state.preemption import Interrupted, Preempted

    console.route_libraries()  # Lightning's loggers, made as it was imported
    _ran = True
    try:
        return run(cfg)
    except Preempted as exc:  # a checkpoint is written (or Ctrl-C): the job can be run again
        sweep = interrupted_sweep() if isinstance(exc, Interrupted) else None
        if _first_on_its_node():  # every rank stopped at the same step: one line per console
            if sweep is None or not _sweep[1]:  # a study's trial is not resumed alone
                print(f"{exc.label}: {exc}", file=sys.stderr, flush=True)
            if sweep is not None:
                print(f"interrupted: {sweep}", file=sys.stderr, flush=True)
        sys.exit(exc.exit_code)
    except Exception as exc:
        user_error = isinstance(exc, TuneupError)
        logged = getattr(exc, "tuneup_log", None)  # the run's log file holds the traceback
        if _is_multirun():
            line = exc if user_error or logged is None else crash_line(exc)
            log.error(
                "run failed: %s%s", rank_prefix(exc), line, exc_info=not user_error and not logged
            )
            return math.nan
        if not user_error and logged is None:  # before the run had a log file: the traceback
            if rank_prefix(exc):  # the traceback does not say which process it comes from
                print(
                    f"error: {rank_prefix(exc)}{type(exc).__name__}: {exc}",
                    file=sys.stderr,
                    flush=True,
                )
            raise
        show_traceback_if_asked(exc)
        line = exc if user_error else crash_line(exc)
        if getattr(exc, "tuneup_every_rank", False):  # the same in every process: said once
            if _first_on_its_node():
                print(f"error: {line}", file=sys.stderr, flush=True)
            sys.exit(1)
        print(f"error: {rank_prefix(exc)}{line}", file=sys.stderr, flush=True)
        sys.exit(1)


def _first_on_its_node() -> bool:
    """Whether this process is its node's local rank 0: the command the user (or the cluster)
    started, whose console the other local ranks share (started by Lightning's launcher, or
    by srun into the same job output)."""
    return (os.environ.get("LOCAL_RANK") or os.environ.get("SLURM_LOCALID") or "0") == "0"


def interrupted_sweep() -> str | None:
    """For Ctrl-C in a sweep: its directory, and that the same command with it continues an
    autotune's or an Optuna sweep's study (the finished trials kept); None outside a sweep."""
    seen = _sweep_seen()
    if seen is None:
        return None
    directory, study = seen
    if study:
        return (
            f"Ctrl-C stopped the sweep in {directory}; the same command with "
            f"hydra.sweep.dir={directory} continues it (its study keeps the finished trials)"
        )
    return (
        f"Ctrl-C stopped the sweep in {directory}: the runs it finished are there "
        f"(python -m tuneup.report {directory} compares them)"
    )


def interrupted_before_start() -> str:
    """For Ctrl-C outside a sweep and a run's training: while Hydra composes the config (a
    sweep's directory is known once it starts: tuneup/sweep_start.py), or around a run."""
    if _ran:  # after the run's own handling (trainer/runner.py) ended
        return "Ctrl-C stopped tuneup"
    sweep = any(a in ("-m", "--multirun") for a in sys.argv[1:])
    what = "the sweep" if sweep else "the run"
    return f"Ctrl-C stopped tuneup before {what} started: nothing was trained"


#: The sweep's directory, and whether it is tuneup's autotune or Optuna sweeper (a study its
#: command continues), as its jobs saw it: Hydra holds its config only while a job runs.
_sweep: tuple[str, bool] | None = None


def _sweep_seen() -> tuple[str, bool] | None:
    """The running sweep (see :data:`_sweep`), noted while a job runs, else as it started
    (tuneup/sweep_start.py: its jobs run in other processes, or none has yet); None outside."""
    global _sweep
    from tuneup import sweep_start

    if _is_multirun():
        from hydra.core.hydra_config import HydraConfig

        _sweep = sweep_start.sweep_of(HydraConfig.get())
    return _sweep or sweep_start.started


def _is_multirun() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN
