"""Preemption: a signal asks the run to stop; it saves a checkpoint and exits with :data:`EXIT_CODE`.

Schedulers announce the end of a job with a signal: Slurm sends SIGTERM on
preemption, ``scancel`` and at the time limit (then SIGKILL after
``KillWait``), and SIGUSR1 (or the signal of ``--signal=USR1@<seconds>``)
ahead of the limit when asked. A handler only sets a flag (:class:`SignalFlag`);
the checkpoint plugin acts on it at the end of the current optimizer step,
where the state is consistent, and raises :class:`Preempted`. ``run.py`` then
exits with :data:`EXIT_CODE` so a job script can tell "checkpoint written,
run me again with resume=auto" from success (0) and errors (1).

Ctrl-C (SIGINT) saves and stops the same way, with exit status 130 (:class:`Interrupted`);
pressed a second time it stops at once, without saving.
"""

from __future__ import annotations

import signal
import threading

from tuneup.errors import TuneupError

#: Exit status after a preemption checkpoint: EX_TEMPFAIL of sysexits.h, "try again later".
EXIT_CODE = 75

#: The signals that mean "save and stop". Ctrl-C's SIGINT does too, once (:class:`SignalFlag`).
SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
#: Exit status after Ctrl-C, saved or not: 128 + SIGINT, as a shell reports a process it ended.
INTERRUPTED_EXIT_CODE = 130


class Preempted(TuneupError):
    """The run stopped on a signal after writing a checkpoint; ``run.py`` exits with EXIT_CODE."""

    exit_code = EXIT_CODE
    label = "preempted"


class Interrupted(Preempted):
    """Ctrl-C: the run stopped (after saving a checkpoint, unless pressed twice); exit 130."""

    exit_code = INTERRUPTED_EXIT_CODE
    label = "interrupted"


def stopped(received: str, step: int, saved, run_dir) -> Preempted:
    """The error a run stopped by ``received`` after ``step`` raises, ``saved`` there."""
    what = "Ctrl-C" if received == "SIGINT" else f"received {received}"
    kind = Interrupted if received == "SIGINT" else Preempted
    return kind(
        f"{what}: stopped after step {step} and saved {saved}; "
        f"continue with: {continue_command(run_dir)}"
    )


def continue_command(run_dir) -> str:
    """The command that continues this run where it stopped, as printed it works: the same
    overrides, ``resume=auto`` and this run's directory (without it, a default directory would
    be a new one, and the run would start again from step 0)."""
    import shlex

    overrides = []
    try:
        from hydra.core.hydra_config import HydraConfig

        if HydraConfig.initialized():
            overrides = list(HydraConfig.get().overrides.task)
    except ImportError:
        pass
    kept = [o for o in overrides if not o.lstrip("+~").startswith(("resume=", "hydra.run.dir="))]
    words = [*kept, "resume=auto", f"hydra.run.dir={run_dir}"]
    return " ".join([command_name(), *(shlex.quote(w) for w in words)])


#: Set by the command (tuneup/cli.py) for the processes its launchers start (DDP ranks, joblib's
#: workers, Slurm jobs), whose own ``sys.argv`` is not what the user typed.
COMMAND_VARIABLE = "TUNEUP_COMMAND"


def command_name() -> str:
    """How the user started tuneup, as they would type it again: ``tuneup``, ``python -m
    tuneup`` or ``python <script>`` (``python run.py`` in a checkout)."""
    import os
    import shlex
    import sys

    if os.environ.get(COMMAND_VARIABLE):
        return os.environ[COMMAND_VARIABLE]
    script = sys.argv[0] if sys.argv else ""
    if script.endswith("__main__.py") or _wrapper(script):
        return "python -m tuneup"
    if script.endswith(".py"):
        return f"python {shlex.quote(script)}"
    return "tuneup"


def _wrapper(script: str) -> bool:
    """Whether the process was started by a launcher's own script, which cannot be run again
    by hand: submitit's ``_submit.py`` in a job of ``hydra/launcher=slurm``."""
    from pathlib import Path

    path = Path(script)
    return path.name == "_submit.py" and path.parent.name == "core" and "submitit" in path.parts


class SignalFlag:
    """Handlers for :data:`SIGNALS` that record the signal; :meth:`restore` puts the old ones back.

    Ctrl-C is recorded the same way, the first time, where Python's own handler was in place
    (not where SIGINT is ignored: a background job): the run saves and stops at the end of the
    step. Pressed again, it raises KeyboardInterrupt at once: no save.
    """

    def __init__(self) -> None:
        self.received: str | None = None  # name of the first signal received
        self._previous: dict = {}

    def remember_handlers(self) -> None:
        """Note the handlers to restore later (before Lightning installs its own)."""
        self._previous = {s: signal.getsignal(s) for s in (*SIGNALS, signal.SIGINT)}

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # Python delivers signals to the main thread only; it cannot install handlers here
        if not self._previous:
            self.remember_handlers()
        for s in SIGNALS:
            signal.signal(s, self._handle)
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, self._handle_ctrl_c)

    def _handle(self, signum, frame) -> None:
        if self.received is None:
            self.received = signal.Signals(signum).name

    def _handle_ctrl_c(self, signum, frame) -> None:
        if self.received is not None:  # the second: stop now, without saving
            signal.signal(signal.SIGINT, signal.default_int_handler)
            raise KeyboardInterrupt
        self.received = "SIGINT"
        from tuneup.trainer.console import process_rank

        if process_rank() == "0":
            import sys

            print(
                "\nCtrl-C: saving a checkpoint at the end of this step, then stopping "
                "(Ctrl-C again: stop now, without saving)",
                file=sys.stderr,
                flush=True,
            )

    def restore(self) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)
        self._previous = {}
