"""The objectives (``hydra.sweeper.objectives``): summary.json keys, checked before any trial
trains and read from each trial's summary.

A ``val.<name>`` objective is the validation's ``val/<name>``: which names a run logs is known
before it trains, from its task (trainer/task.py ``Task.metrics``: ``val/loss``, and
``val/acc`` for the tasks with accuracy), as ``target.metric`` is checked
(plugins/target/plugin.py). So :func:`objective_problems` refuses ``val.f1`` up front, in the
sweeper (for the sweep's config) and in each job's check (for the trial's: a swept ``model``
may change the task). A user's LightningModule logs what it logs: not known before it runs.
Other keys (``samples_per_s``, ``peak_memory_bytes``, ``time_to_target_s``...) are figures
the run and its plugins write at its end; a trial whose summary lacks one is failed, with the
numbers its summary has (plugins/optuna_trial.py).
"""

from __future__ import annotations

import math

VAL = "val."


def objective(summary: dict, key: str) -> float | None:
    """``summary.json``'s value at ``key`` (``val.acc``: summary["val"]["acc"]), if a number."""
    value = summary
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        return None
    return float(value)


def objective_problems(objectives: list[str], cfg, plan) -> list[str]:
    """The ``val.*`` objectives a run of ``cfg`` (``plan``: trainer/components.py) never
    logs, one problem each, naming what it logs."""
    wanted = [str(key) for key in objectives if str(key).startswith(VAL)]
    if not wanted:
        return []
    if cfg.trainer.get("limit_val_batches") in (0, 0.0):
        return [
            f"hydra.sweeper.objectives: {', '.join(wanted)} needs validation, but "
            "trainer.limit_val_batches=0 turns it off"
        ]
    if not plan.sound or plan.lightning:  # the core reports an unsound plan; a user's module
        return []  # logs what it logs
    logged = [f"{VAL}{m.removeprefix('val/')}" for m in plan.task.metrics]
    return [
        f"hydra.sweeper.objectives: {key} is not logged by this run: task={plan.task.name} "
        f"logs {', '.join(plan.task.metrics)} at each validation; give one of "
        f"{', '.join(logged)}, or a figure of summary.json (samples_per_s, peak_memory_bytes...)"
        for key in wanted
        if key not in logged
    ]


def missing(summary: dict, objectives: list[str]) -> list[str]:
    """The objectives that are not a number in ``summary``."""
    return [key for key in objectives if objective(summary, key) is None]


def numbers(summary: dict, prefix: str = "") -> list[str]:
    """The keys of ``summary``'s numbers, as objectives name them (``val.acc``), lists and
    plugins' settings left out: what a user may give instead."""
    found = []
    for key, value in summary.items():
        if isinstance(value, dict) and key != "plugins":
            found += numbers(value, f"{prefix}{key}.")
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            found.append(f"{prefix}{key}")
    return found
