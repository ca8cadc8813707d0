"""What a run says about itself: its one line before it starts (:func:`plan_line`), and at its
end the plugins' reports, summary.json and the console's table or, for a sweep's job, one line
(:func:`finish`). The end is written after a failure too: what was measured is kept.
"""

from __future__ import annotations

import logging
import os
import platform
from pathlib import Path

from tuneup.trainer import console, openmp
from tuneup.trainer import summary as run_summary
from tuneup.trainer.components import Plan
from tuneup.trainer.environment import Environment
from tuneup.trainer.module import TrainingModule
from tuneup.trainer.state.data_order import dropped_per_epoch
from tuneup.trainer.state.preemption import command_name

#: The run's lines are the runner's in tuneup.log, whichever of its modules says them.
log = logging.getLogger("tuneup.trainer.runner")


def plan_line(plan: Plan, env: Environment, run_dir: Path) -> str:
    """The run in one line, before it starts: what trains on what, where, into which directory."""
    choices = [
        f"{g}={plan.cfg[g].get('name')}"
        for g in ("precision", "memory_format", "strategy")
        if plan.cfg.get(g) is not None
    ]
    return (
        f"tuneup: {plan.model_name} on {plan.data_name}, {', '.join(choices)}; "
        f"{env.device_name}; run directory {run_dir}"
    )


def finish(cfg, plugins, trainer, summary: dict, run_dir: Path) -> None:
    """Report and write the summary, also after a failure: what was measured is kept."""
    if trainer is not None:
        summary.update(
            world_size=trainer.world_size, steps=trainer.global_step, epochs=trainer.current_epoch
        )
        dropped = dropped_per_epoch(trainer.train_dataloader)  # full batches only
        if dropped is not None:
            summary["dropped_per_epoch"] = dropped
        if isinstance(trainer.lightning_module, TrainingModule):  # measured: grad_norm
            summary.update(trainer.lightning_module.grad_norm.summary())
    summary.update(python=platform.python_version(), torch=_torch_version())
    if openmp.VARIABLE in os.environ:  # how OpenMP's threads wait here, and why
        summary["openmp_wait"] = os.environ[openmp.VARIABLE]
    if plugins is not None:
        summary["plugins"] = plugins.describe(cfg)
        # each plugin's report by itself: one failing keeps the others' figures
        failed = (
            plugins.call_each("report", cfg=cfg, summary=summary) if trainer is not None else {}
        )
        if failed:
            summary["report_errors"] = failed  # the status stays: the run itself is done
    summary["command"] = command_name()
    path = run_summary.write(summary, run_dir)
    if summary["status"] in ("ok", "pruned"):  # pruned: an Optuna trial stopped by its pruner
        job = sweep_job()
        if job is not None:  # a sweep's job: one line (the report at the end compares them)
            line = run_summary.one_line(summary, job)
            console.say(f"{line}; summary written to {path}", log)
            return
        if cfg.get("measure", {}).get("console_table", True):  # summary.json has it anyway
            console.say(run_summary.format_table(summary), log)
        console.say(f"summary written to {path}", log)


def sweep_job() -> str | None:
    """``#<job> <overrides>`` when this run is a job of a sweep (Hydra multirun), else None."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return None
    hydra = HydraConfig.get()
    return f"#{hydra.job.num} {' '.join(hydra.overrides.task)}".strip()


def _torch_version() -> str:
    import torch

    return torch.__version__
