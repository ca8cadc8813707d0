"""Figures of one time-to-target trial, read from its summary.json (time_to_target.py)."""

from __future__ import annotations

import itertools
import math

from tuneup.autotune.race import reached
from tuneup.autotune.trials import Trial
from tuneup.stats.interval import trial_speed

BASELINE_ATTR, JOB_ATTR, OVERRIDES_ATTR = "tuneup_baseline", "tuneup_job", "tuneup_overrides"
NEVER_ATTR = "tuneup_never_launched"
#: ``autotune.cost``: what a trial's way to the target costs (:func:`trial_cost`).
TIME, STEPS, SAMPLES = "time", "steps", "samples"
COSTS = (TIME, STEPS, SAMPLES)
UNITS = {TIME: "s", STEPS: "steps", SAMPLES: "samples"}


def samples_seen(trial: Trial) -> int:
    history = trial.figure("target_history") or []
    seen = history[-1]["samples"] if history else 0
    return int(trial.figure("samples_to_target") or seen or 0)


def relative_gap(trial: Trial) -> float:
    """The relative distance to the target at the trial's last validation."""
    target = trial.figure("target") or {}
    history = trial.figure("target_history") or []
    value, goal = (history[-1]["value"] if history else None), target.get("value")
    if value is None or goal is None or not math.isfinite(value):
        return 1.0
    gap = goal - value if target.get("mode") == "max" else value - goal
    return gap / abs(goal) if goal else gap


def steps_seen(trial: Trial) -> int:
    """Optimizer steps to the target, or to the trial's last validation (a miss)."""
    history = trial.figure("target_history") or []
    return int(trial.figure("steps_to_target") or (history[-1]["step"] if history else 0))


def step_seconds(trial: Trial) -> float | None:
    """Seconds per optimizer step of the trial's own steps: its samples per step over its
    fastest speed window (interval.trial_speed, as the throughput objective measures a
    configuration: load on the machine only ever slows a window down)."""
    speed, batch = trial_speed(trial.summary), trial.figure("effective_batch_size")
    return batch / speed if speed and batch else None


def validation_seconds(trial: Trial) -> float:
    """The validations' wall time up to the target (all of them for a miss)."""
    if reached(trial) and trial.figure("time_to_target_train_s") is not None:
        return float(trial.figure("time_to_target_s") - trial.figure("time_to_target_train_s"))
    return float(trial.figure("validation_time_s") or 0.0)


def trial_cost(trial: Trial, cost: str = TIME) -> float | None:
    """What the trial's way to the target cost (so far, for a miss), in ``cost``'s units:
    ``time``: its steps x its own seconds per step + its validations' seconds (the time to
    target on this machine, without the start-up and the noise of a slow window);
    ``steps``: its optimizer steps (every step costs the same: a GPU that small batches do
    not fill); ``samples``: its samples. None: a time without a speed window."""
    if cost == SAMPLES:
        return float(samples_seen(trial))
    if cost == STEPS:
        return float(steps_seen(trial))
    per_step = step_seconds(trial)
    if per_step is None:
        return None
    return steps_seen(trial) * per_step + validation_seconds(trial)


def trial_value(trial: Trial, cost: str = TIME) -> float | None:
    """The study's value of a finished trial: its cost to the target; a miss, its cost so
    far x (1 + its last relative distance from the target); the study is told at least the
    costliest hit's value x the same (explore.py: above_the_hits)."""
    found = trial_cost(trial, cost)
    if found is None or reached(trial):
        return found
    return found * (1 + max(0.0, relative_gap(trial)))


def seed_figure(trial: Trial, cost: str = TIME) -> tuple[float, bool]:
    """(cost to target in ``cost``'s units, reached) of a confirm trial; a miss: its cost so
    far (a lower bound). A time without a speed window falls back to the trial's own clock."""
    found = trial_cost(trial, cost)
    if found is None:
        found = trial.figure("time_to_target_s") or (trial.figure("fit_seconds") or 0.0)
    return float(found), reached(trial)


def figures(trial: Trial, cost: str = TIME) -> dict:
    """The cost and, beside it, the counts (autotune.json, autotune.md, the console)."""
    return {
        "cost": trial_cost(trial, cost),
        "steps": steps_seen(trial),
        "samples": samples_seen(trial),
        "step_s": step_seconds(trial),
        "validation_s": validation_seconds(trial),
    }


def console_line(found: dict, cost: str) -> str:
    """A race run's cost to the target and, beside it, its steps and samples."""
    value = found.get("cost")
    shown = (
        "-"
        if value is None
        else f"{value:.3g} s"
        if cost == TIME
        else (f"{value:,.0f} {UNITS[cost]}")
    )
    what = "to the target" if found.get("reached") else "so far, target not reached"
    return (
        f"{shown} {what} ({found.get('steps') or 0:,} steps, {found.get('samples') or 0:,} "
        f"samples; autotune.cost={cost})"
    )


def quantum(trial: Trial, cost: str = SAMPLES) -> float:
    """The validation lattice's step in ``cost``'s units (:func:`seed_figure`'s): a value to
    target is read at a validation, so it is known to one gap between validations
    (``target.check_every_n_steps`` x the batch, or an epoch). ``time``: the gap in steps x
    the trial's own seconds per step."""
    if cost == SAMPLES:
        return lattice_gap(trial, "samples")
    steps = lattice_gap(trial, "step")
    if cost == STEPS:
        return steps
    return steps * (step_seconds(trial) or 0.0)


def lattice_gap(trial: Trial, key: str) -> float:
    """The median gap between a trial's validations in ``target_history[key]`` (the first
    from 0); 0.0 without a validation."""
    history = trial.figure("target_history") or []
    marks = [0, *(entry[key] for entry in history if entry.get(key) is not None)]
    gaps = sorted(b - a for a, b in itertools.pairwise(marks) if b > a)
    return float(gaps[len(gaps) // 2]) if gaps else 0.0


def config_value(config, key: str):
    node = config
    for part in key.split("."):
        node = node.get(part) if hasattr(node, "get") else None
        if node is None:
            return None
    if hasattr(node, "get") and "name" in node:
        return node.get("name")  # a group: its choice's name
    return node


def contains(dist, value) -> bool:
    from optuna.distributions import CategoricalDistribution

    if isinstance(dist, CategoricalDistribution):
        return value in dist.choices
    try:
        return dist.low <= value <= dist.high
    except TypeError:
        return False
