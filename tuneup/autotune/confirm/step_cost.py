"""Seconds per optimizer step measured apart, for ``autotune.cost=time`` when the workers
share the cores (``autotune.workers`` > 1 on a CPU).

A run's time to target is its steps x its seconds per step + its validations' seconds
(study/trials.py: trial_cost). The steps are exact counts whatever else runs; the seconds per step
are not: a trial that ran beside another worker on the same cores measured the other's load
as well as its own configuration, and by how much depends on what ran beside it. So before
the study's candidates are ranked for the confirmation, the configurations in contention (the
best distinct ones that reached the target, and your command) are timed one at a time, in
short throughput trials interleaved as the speed stage's (confirm/speed.py: the order reversed
every round, each trial's fastest window, the median over ``autotune.min_rounds`` rounds),
and those seconds per step replace the trials' own in the ranking and in the confirmation's
per-seed costs. Where each worker has a device of its own, its own windows count.
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING

from tuneup.autotune.confirm.speed import SPEED
from tuneup.autotune.race import NO_TARGET, speed_settings
from tuneup.autotune.study.trials import steps_seen, validation_seconds

if TYPE_CHECKING:
    from tuneup.autotune.confirm.inputs import ConfirmInputs

#: the configurations timed apart: this many x autotune.confirm (the ranking's contenders)
CONTENDERS = 2


def applies(search: ConfirmInputs) -> bool:
    """Whether trials' own step times are not comparable: time ranks, and workers share cores."""
    return search.settings.cost == "time" and search.workers.shared_cores


def rule(search: ConfirmInputs) -> str:
    """Which seconds per step the time to target was ranked by, in words (autotune.md)."""
    if search.settings.cost != "time" or search.workers.count == 1:
        return ""
    if search.workers.cuda:
        return (
            f"autotune.workers={search.workers.count}, one GPU each: each run's time to target "
            "uses its own seconds per step"
        )
    return (
        f"autotune.workers={search.workers.count} shared the cores: the candidates' and your "
        "command's seconds per step were timed one at a time, interleaved, before the "
        "ranking; each run's time to target uses them"
    )


def measure(search: ConfirmInputs, configs: list[tuple[str, ...]]) -> dict[tuple[str, ...], float]:
    """Seconds per optimizer step of each of ``configs`` (overrides; () is your command),
    from ``autotune.min_rounds`` rounds of serial throughput trials, the order reversed every
    round; a configuration without a speed window is left out. Rounds stop when the budget
    has no room for one more beside the confirmation's."""
    settings = search.settings
    speeds: dict[tuple[str, ...], list[float]] = {c: [] for c in configs}
    one = max(1.0, search.typical_seconds() / 2)
    for number in range(settings.min_rounds):
        if search.left() - search.confirm_seconds() < one * len(configs):
            search.notes.append(
                f"seconds per step timed apart in {number} round(s): the budget ran out"
            )
            break
        for overrides in configs[:: -1 if number % 2 else 1]:
            run = speed_settings(settings.trial_steps, search.batch(overrides), search.left())
            trial = search.lab.run(SPEED, (*overrides, *NO_TARGET), settings=run)
            if trial.speed:
                speeds[overrides].append(trial.speed)
    return {c: search.batch(c) / statistics.median(s) for c, s in speeds.items() if s}


def time_to_target(trial, step_s: float) -> float:
    """A run's time to target (so far, for a miss) at ``step_s`` seconds per step."""
    return steps_seen(trial) * step_s + validation_seconds(trial)
