"""Seconds per optimizer step of each contender's recipe, measured paired in one window.

The autotune's throughput trials (tuneup/autotune/trials.py ``trial_settings``: a fixed
number of steps, no validation, no checkpoints; no target), one per recipe per round, the
rounds run back to back with the order reversed each round (A B C, C B A, ...), so that
every recipe sees the same load on a shared machine. A trial's speed is its fastest window
(``interval.trial_speed``, as the throughput objective reads it); a recipe's seconds per step
is its samples per step over the median of its rounds' speeds, and its ratio to the default
a Student's t interval over the rounds' paired log ratios (``interval.paired``).
"""

from __future__ import annotations

import re
import statistics
from pathlib import Path

from race_runs import train


def measure(
    command: list[str],
    recipes: dict[str, list[str]],
    folder: Path,
    rounds: int,
    steps: int,
    confidence: float = 0.95,
    limit_s: float | None = None,
) -> dict[str, dict]:
    """``recipes``: name -> overrides on the task's command, the first the reference; each
    trial runs ``steps`` steps or ``limit_s`` seconds of training, whichever ends first.
    Returns per name: ``seconds_per_step`` (None when no trial ran), ``speeds`` (samples/s
    per round), ``batch`` and ``ratio`` (its s/step over the reference's, with ``low``,
    ``high``)."""
    from tuneup.autotune.race import NO_TARGET
    from tuneup.autotune.trials import trial_settings
    from tuneup.stats.interval import paired, trial_speed

    names = list(recipes)
    speeds: dict[str, list] = {name: [] for name in names}
    batch: dict[str, int] = {}
    for number in range(rounds):
        for name in names[:: -1 if number % 2 else 1]:
            run = Path(folder) / f"round{number}" / re.sub(r"\W+", "_", name)
            summary = train(
                [*command, *recipes[name], *trial_settings(steps, limit_s), *NO_TARGET, "seed=0"],
                run,
            )
            speeds[name].append(trial_speed(summary) if summary.get("status") == "ok" else None)
            batch[name] = summary.get("effective_batch_size") or batch.get(name)
    found = {}
    reference = names[0]
    for name in names:
        valid = [s for s in speeds[name] if s]
        per_step = batch[name] / statistics.median(valid) if valid and batch.get(name) else None
        pairs = [(r, c) for r, c in zip(speeds[reference], speeds[name], strict=True) if r and c]
        ratio = None
        if pairs and name != reference:
            r, c = zip(*pairs, strict=True)
            speed = paired(list(r), list(c), confidence)  # candidate / reference samples/s
            steps_ratio = batch[name] / batch[reference]
            ratio = {
                "estimate": steps_ratio / speed.estimate,
                "low": steps_ratio / speed.high if speed.high else 0.0,
                "high": steps_ratio / speed.low if speed.low else None,
            }
        found[name] = {
            "seconds_per_step": per_step,
            "speeds": speeds[name],
            "batch": batch.get(name),
            "ratio": ratio,
        }
    return found
