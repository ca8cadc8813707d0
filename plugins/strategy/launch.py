"""Start ranks > 0 on this node as the same Hydra *job*, not as the same command line.

Lightning's DDP/FSDP launcher (``_SubprocessScriptLauncher``) starts each extra
local rank by running the script again. Under Hydra it uses
``lightning_fabric.strategies.launchers.subprocess_script._hydra_subprocess_cmd``,
which in Lightning 2.6 re-runs ``sys.argv`` plus ``hydra.run.dir=<hydra.run.dir>``.
That is right for a single run and wrong in a multirun (Lightning issue 11300,
lightning-hydra-template issue 393): the argv holds ``-m`` and the sweep's lists, so
every child starts the whole sweep again, and ``hydra.run.dir`` is not the job's
directory (a multirun job writes to ``hydra.sweep.dir/<subdir>``), so children
write outputs elsewhere.

:func:`job_command` builds the child's command from the running job instead: the
job's own overrides (``hydra.overrides.task``: one value per key, never a sweep),
run mode, and ``hydra.run.dir`` = the job's output directory. So the child composes
the same config, joins the same run directory and never sweeps. It writes no
``.hydra/`` (``hydra.output_subdir=null``) and only global rank 0 writes
``summary.json`` (trainer/run_report.py), so a job has one directory and one summary.

``torch.multiprocessing`` spawning (``ddp_spawn``) would avoid re-running the
script, but it runs training in spawned processes whose plugin objects are copies:
the measurements, checkpoint bookkeeping and signal handlers of the process that
reports would not be the ones that trained. Re-running the job keeps every rank a
whole tuneup process.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from types import SimpleNamespace
from unittest import mock

import torch
from pytorch_lightning.strategies.launchers import subprocess_script as pl_launcher

from tuneup.trainer.state.preemption import Preempted

#: Command-line options of a Hydra app that take a value and must reach the child as given.
CONFIG_OPTIONS = ("--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd")
#: Hydra overrides that belong to the sweep or to the parent's run directory, not to the job.
SWEEP_ONLY = (
    "hydra.mode",
    "hydra.sweep",
    "hydra.sweeper",
    "hydra.launcher",
    "hydra/launcher",
    "hydra/sweeper",
    "hydra.run.dir",
    "hydra.job.name",
    "hydra.output_subdir",
)

#: Environment variables Lightning's launcher sets in the launching process.
LAUNCH_ENV = ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "LOCAL_RANK", "WORLD_SIZE")
#: Seconds to wait for the other local ranks to exit after a successful job.
CHILD_EXIT_S = 120
#: Seconds the other local ranks get to end by themselves when rank 0 fails, before they are
#: killed: a failed run leaves no process behind (one still starting would join nobody,
#: retry connecting until its own timeout, and write into the finished run's log).
FAILED_CHILD_EXIT_S = 5


def config_options(argv: list[str]) -> list[str]:
    """The ``--config-path/-name/-dir`` options in ``argv`` (both ``-cp x`` and ``--config-path=x``)."""
    kept, take_next = [], False
    for arg in argv:
        if take_next:
            kept.append(arg)
            take_next = False
        elif arg in CONFIG_OPTIONS:
            kept.append(arg)
            take_next = True
        elif arg.startswith(tuple(f"{o}=" for o in CONFIG_OPTIONS)):
            kept.append(arg)
    return kept


def job_command(
    script: list[str],
    argv: list[str],
    task_overrides: list[str],
    hydra_overrides: list[str],
    output_dir: str,
    local_rank: int,
) -> list[str]:
    """The command that runs local rank ``local_rank`` of the Hydra job whose parts are given."""
    hydra_kept = [o for o in hydra_overrides if not o.lstrip("+~").startswith(SWEEP_ONLY)]
    return [
        *script,
        *config_options(argv),
        *task_overrides,
        *hydra_kept,
        f'hydra.run.dir="{output_dir}"',
        f"hydra.job.name=train_ddp_process_{local_rank}",
        "hydra.output_subdir=null",
    ]


def hydra_job_command(local_rank: int) -> tuple[list[str], str]:
    """Drop-in for Lightning's ``_hydra_subprocess_cmd``: (command, cwd) for the running job."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.utils import get_original_cwd, to_absolute_path

    import __main__

    if __main__.__spec__ is None:
        script = [sys.executable, to_absolute_path(sys.argv[0])]
    else:
        script = [sys.executable, "-m", __main__.__spec__.name]
    config = HydraConfig.get()
    command = job_command(
        script,
        sys.argv[1:],
        list(config.overrides.task),
        list(config.overrides.hydra),
        config.runtime.output_dir,
        local_rank,
    )
    return command, get_original_cwd()


@contextmanager
def hydra_jobs_for_children():
    """While active, Lightning's launcher starts children with :func:`hydra_job_command`,
    each ended by the kernel when this process ends (:func:`ended_with_parent`).

    The launcher calls the module-level function (and ``subprocess.Popen``) by name; there is
    no argument to pass others, so the names are replaced in its module for the launch.
    """
    popen = functools.partial(subprocess.Popen, preexec_fn=ended_with_parent())
    with (
        mock.patch.object(pl_launcher, "_hydra_subprocess_cmd", hydra_job_command),
        mock.patch.object(pl_launcher, "subprocess", SimpleNamespace(Popen=popen)),
    ):
        yield


def ended_with_parent():
    """A ``preexec_fn`` that has the child killed when the process that started it ends, as
    it is on Linux (``PR_SET_PDEATHSIG``); None elsewhere. Rank 0 killed (the OOM killer, a
    ``kill -9``) while a rank it started is still importing would leave that rank to retry
    reaching it for ``strategy.join_timeout_s``; with this it ends with rank 0."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved here, not in the fork

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)

    return preexec


#: prctl(2)'s option: the signal a process gets when its parent ends.
PR_SET_PDEATHSIG = 1


class HydraJobLauncher(pl_launcher._SubprocessScriptLauncher):
    """Lightning's subprocess launcher whose children run the current Hydra job (see module doc).

    It also undoes what a job's launch leaves behind in the launching process, so the
    next job of a sweep launches afresh: Lightning's launcher sets ``LOCAL_RANK``,
    ``WORLD_SIZE``, ``MASTER_PORT``... in ``os.environ`` (with ``LOCAL_RANK`` set, the
    next job would believe its processes were started by someone else and start none)
    and leaves the process group initialised (the next job would reuse it, with peers
    that have exited). Both must stay while the job lasts (a ``trainer.validate`` after
    ``fit`` launches again and finds its processes by them), so they are undone when
    the next job's launcher starts: :func:`forget_previous_job`.
    """

    def launch(self, function, *args, trainer=None, **kwargs):
        global _launched
        if _launched is not None and _launched[0] is not self:
            forget_previous_job()
        if _launched is None and not self.cluster_environment.creates_processes_externally:
            _launched = (self, {name: os.environ.get(name) for name in LAUNCH_ENV})
        try:
            return super().launch(function, *args, trainer=trainer, **kwargs)
        except BaseException as exc:
            self.end_children(CHILD_EXIT_S if isinstance(exc, Preempted) else FAILED_CHILD_EXIT_S)
            raise

    def end_children(self, grace_s: float) -> None:
        """Wait up to ``grace_s`` for the local ranks this process started, then kill them.

        A preempted run's ranks are saving and ending together (CHILD_EXIT_S, as after a
        finished job); any other failure of rank 0 ends the run, and ranks still starting,
        waiting in a collective or retrying to connect would live on without it (Lightning
        kills them only on Ctrl-C). They leave Lightning's observer first: it would take
        their death for a failure and kill this process before it reports its own error.
        """
        children = list(self.procs)
        self.procs.clear()  # the observer's list too (the same object)
        deadline = time.monotonic() + grace_s
        for proc in children:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def _call_children_scripts(self) -> None:
        with hydra_jobs_for_children():
            super()._call_children_scripts()


#: The launcher that started local ranks in this process, and the environment before it did.
_launched: tuple[HydraJobLauncher, dict] | None = None


def forget_previous_job() -> None:
    """Wait for the previous job's other ranks, close its process group, restore the environment."""
    global _launched
    launcher, environment = _launched
    _launched = None
    for proc in launcher.procs:
        try:
            proc.wait(timeout=CHILD_EXIT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    for name, value in environment.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
