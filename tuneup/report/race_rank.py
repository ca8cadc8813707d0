"""The order of a race's configurations: by time to target only where the difference is
beyond the noise, else by steps to target.

A wall time to target is one sample of a noisy quantity: the machine's load, the seed's luck,
the validations' cost. Ranking two configurations by one seed's seconds each claims a
difference nobody measured. So the project's interval rule (tuneup/stats/interval.py: a
difference is claimed only when its confidence interval excludes 1.0) decides whether time
ranks, over each configuration's seeds: paired by seed where both ran the same seeds (the
seed's own luck cancels, as in the autotune's paired seeds, tuneup/stats/paired.py), else
Welch's t over the seeds' times. One seed on either side gives no interval: no time claim.

Where time cannot tell configurations apart, their steps to target do: exact for a seed, and
what the time is made of (at equal cost per step). The order, configuration by configuration:

1. configurations whose seeds all reached the target, then those where fewer did (a median
   over fewer seeds flatters: the others' times are not known), then those that never did;
2. in each, the fastest median time leads a block of every configuration whose time is
   within noise of it; the block is ordered by median steps to target (then time); the
   configurations slower beyond the noise follow, ranked the same way among themselves.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from tuneup.report.comparison import CONFIDENCE
from tuneup.stats.interval import NOISE, paired, welch

#: The two rules that can place a configuration.
TIME, STEPS, ALONE = "time to target", "steps to target", "alone"


@dataclass
class Block:
    """Configurations ranked together: one rule placed them (``decided``), ``why`` in words."""

    groups: list  # race.Group, best first
    decided: str  # TIME: the leader is ahead of all the rest beyond the noise; STEPS; ALONE
    why: str


def time_ratio(leader, other):
    """``other``'s time to target / ``leader``'s with its interval (interval.Interval), over
    their seeds that reached the target; None without enough seeds to judge."""
    a, b = _times_by_seed(leader), _times_by_seed(other)
    seeds = [seed for seed, _ in a]
    if seeds and None not in seeds and sorted(seeds) == sorted(seed for seed, _ in b):
        a, b = dict(a), dict(b)
        return paired([a[s] for s in seeds], [b[s] for s in seeds], CONFIDENCE)
    return welch([t for _, t in a], [t for _, t in b], CONFIDENCE)


def beyond_noise(interval) -> bool:
    """Whether ``other`` is slower than the leader beyond the noise (the interval above 1.0)."""
    return interval is not None and interval.verdict != NOISE and interval.low > 1


def rank(groups: list) -> tuple[list, list[Block]]:
    """The groups in report order and the blocks that placed the ones that reached the
    target; groups that never reached it (or raced without a target value) last, in job
    order."""
    scored = [g for g in groups if g.has_value and g.figures("time_to_target_s")]
    tiers: dict[tuple, list] = {}
    for group in scored:
        tiers.setdefault(_reach(group), []).append(group)
    blocks = []
    for key in sorted(tiers):
        blocks += _blocks(tiers[key])
    ordered = [g for block in blocks for g in block.groups]
    return ordered + [g for g in groups if g not in ordered], blocks


def _blocks(groups: list) -> list[Block]:
    remaining = sorted(groups, key=lambda g: _median(g, "time_to_target_s"))
    blocks = []
    while remaining:
        leader = remaining[0]
        ratios = {id(g): time_ratio(leader, g) for g in remaining[1:]}
        tied = [leader, *(g for g in remaining[1:] if not beyond_noise(ratios[id(g)]))]
        tied.sort(key=lambda g: (_median(g, "steps_to_target"), _median(g, "time_to_target_s")))
        remaining = [g for g in remaining if g not in tied]
        blocks.append(_block(tied, bool(remaining)))
    return blocks


def _block(tied: list, slower_follow: bool) -> Block:
    from tuneup.report.cells import code

    if len(tied) > 1:
        unknown = any(len(g.figures("time_to_target_s")) < 2 for g in tied)
        reason = (
            "one seed on a side gives no interval"
            if unknown
            else f"each time ratio's {CONFIDENCE:.0%} interval includes 1.0"
        )
        names = ", ".join(code(_name(g)) for g in tied)
        return Block(
            tied,
            STEPS,
            f"{names}: their times to target are within noise of the "
            f"fastest ({reason}), so the fewest median steps to target "
            "ranks them",
        )
    if slower_follow:
        return Block(
            tied,
            TIME,
            f"{code(_name(tied[0]))}: faster to the target, beyond the "
            "noise, than every configuration after it that reached it as "
            f"often (each time ratio's {CONFIDENCE:.0%} interval above "
            "1.0)",
        )
    return Block(
        tied,
        ALONE,
        f"{code(_name(tied[0]))}: the only one left of those that reached the target as often",
    )


def _reach(group) -> tuple:
    return (len(group.reached) < len(group.runs), -len(group.reached) / len(group.runs))


def _times_by_seed(group) -> list[tuple]:
    """(seed, time to target) of the group's runs that reached it; seed None: not given."""
    from tuneup.report.runs import seed_of

    return [
        (seed_of(run), float(run.summary["time_to_target_s"]))
        for run in group.reached
        if isinstance(run.summary.get("time_to_target_s"), int | float)
    ]


def _median(group, key: str) -> float:
    values = group.figures(key)
    return statistics.median(values) if values else float("inf")


def _name(group) -> str:
    return " ".join(group.overrides) or "-"
