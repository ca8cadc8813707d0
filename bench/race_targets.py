"""bench/race.py --choose-targets: each task's target and AlgoPerf's step_hint, chosen from the
default alone (its run on seed 0 at full length, no target value) before any search ran on it.
"""

from __future__ import annotations

import math
from pathlib import Path

import race_runs
import race_tasks


def target_rule(summary: dict) -> dict | None:
    """The rule the targets were chosen by, on the default's run at full length (seed 0, no
    target value): accuracy: its best x 0.99 rounded down, loss: its best x 1.02 rounded up,
    to 0.01; the steps the default took to that target; step_hint 1.25 x those steps."""
    import numpy

    target = summary.get("target") or {}
    best, history = target.get("best"), summary.get("target_history") or []
    if best is None:
        return None
    high = target.get("mode", "max") == "max"
    value = math.floor(best * 99) / 100 if high else math.ceil(best * 102) / 100
    at = numpy.float32(value)  # as the target plugin compares: at the metric's float32
    step = next(
        (
            h["step"]
            for h in history
            if (numpy.float32(h["value"]) >= at if high else numpy.float32(h["value"]) <= at)
        ),
        None,
    )
    return {
        "best": best,
        "best_step": target.get("best_step"),
        "target": value,
        "steps": step,
        "step_hint": math.ceil(1.25 * step) if step else None,
    }


def choose_targets(tasks: list[str], folder: Path) -> None:
    """Each task's default on seed 0 at its full length, no target value, and what
    :func:`target_rule` makes of it."""
    print(
        "| task | default's best (step) | target by the rule | default's steps to it | step_hint |"
    )
    print("|---|---|---:|---:|---:|")
    for name in tasks:
        command = race_tasks.command(name, folder)
        summary = race_runs.train(
            [*command, "target.value=null", "seed=0", *race_runs.QUIET], folder / name
        )
        rule = target_rule(summary)
        if rule is None:
            print(f"| {name} | failed: {summary.get('error')} | | | |")
            continue
        print(
            f"| {name} | {rule['best']:.4f} ({rule['best_step']}) | {rule['target']:.2f} | "
            f"{rule['steps']} | {rule['step_hint']} |"
        )
