"""Figures of one time-to-target trial, read from its summary.json (study_search.py)."""

from __future__ import annotations

import itertools
import math

from tuneup.autotune.race import reached
from tuneup.autotune.trials import Trial

BASELINE_ATTR, JOB_ATTR, OVERRIDES_ATTR = "tuneup_baseline", "tuneup_job", "tuneup_overrides"
NEVER_ATTR = "tuneup_never_launched"


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


def seed_figure(trial: Trial) -> tuple[float, bool]:
    """(samples to target, reached) of a confirm trial; a miss: the samples it ran."""
    if reached(trial):
        return float(trial.figure("samples_to_target")), True
    return float(samples_seen(trial)), False


def quantum(trial: Trial) -> float:
    """The validation lattice's step in :func:`seed_figure`'s units (samples): a value to
    target is read at a validation, so it is known to one gap between validations
    (``target.check_every_n_steps`` x the batch, or an epoch). The units are chosen here
    only: :func:`lattice_gap` of the history's key that matches seed_figure's figure."""
    return lattice_gap(trial, "samples")


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
