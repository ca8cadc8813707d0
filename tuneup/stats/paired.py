"""Decisions on paired seeds: a candidate joins the recipe only when its gain holds seed by seed.

Samples to target are exact and repeat for the same seed (on a CPU), so the noise they carry
is the seed's, not the machine's. A candidate and the baseline run on the same seeds; the
gain is the mean of the per-seed differences (candidate - baseline) with Student's t interval
(``autotune.confidence``), their standard deviation at least the validation lattice's and the
seeds' pooled spread (:func:`paired_gain`). It is ``better`` only when the interval lies below
0, ``worse`` when above, else ``not significant`` (the recipe stays); sequential.py adds seeds
while a candidate is undecided and corrects ``better`` for the seeds added and for the
candidates compared. A candidate that misses the target in a seed cannot be accepted. A
baseline that misses it in a seed counts at the samples it ran (a lower bound of its samples
to target): the candidate's difference is then at least what is stated, so the decision stays
on the safe side.

Pure Python: unit-tested on given per-seed samples (tests/test_autotune_decisions.py).
"""

from __future__ import annotations

import math
import statistics

from tuneup.stats.interval import t_quantile, two_sided

BETTER, WORSE, NOISE, MISSED = "better", "worse", "not significant", "missed the target"


def mean_interval(values: list[float], confidence: float, floor: float | None = None):
    """The mean and its Student's t interval; None without values (one value: no width).
    ``floor``: the lowest value the quantity can take (0 for samples and seconds)."""
    if not values:
        return None
    mean = statistics.fmean(values)
    if len(values) < 2:
        return {"estimate": mean, "low": None, "high": None, "n": 1, "confidence": confidence}
    half = (
        t_quantile(confidence, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    )
    low = mean - half if floor is None else max(floor, mean - half)
    return {
        "estimate": mean,
        "low": low,
        "high": mean + half,
        "n": len(values),
        "confidence": confidence,
    }


def prediction_interval(
    values: list[float],
    confidence: float,
    spread: tuple[float, int] | None = None,
    quantum: float = 0.0,
):
    """Where one more seed's value falls: Student's t prediction interval (the mean's interval
    widened by sqrt(1 + 1/n)) on the log scale, back as a ratio of the geometric mean; what a
    re-run on a seed the search never saw should land in. None with fewer than two values.

    Samples (steps, seconds) to target are positive and their seed noise is multiplicative (a
    slow seed takes a multiple of a fast one's): on the log scale one spread fits values of
    every size, and the interval never goes below 0. ``spread``: a standard deviation of log
    values and its degrees of freedom to use instead of the values' own
    (:func:`pooled_spread` with ``log=True``), floored at the validation lattice's:
    ``quantum`` (the gap between two validations, in the values' units) read as a uniform
    rounding, sd quantum / sqrt(12), relative to the values."""
    positive = [v for v in values if v > 0]
    if len(positive) < 2:
        return None
    logs = [math.log(v) for v in positive]
    mean = statistics.fmean(logs)
    sd, df = spread or (statistics.stdev(logs), len(logs) - 1)
    sd = max(sd, quantum / math.sqrt(12) / math.exp(mean))
    half = t_quantile(confidence, df) * sd * math.sqrt(1 + 1 / len(logs))
    return {
        "estimate": math.exp(mean),
        "low": math.exp(mean - half),
        "high": math.exp(mean + half),
        "n": len(logs),
        "confidence": confidence,
        "scale": "log",
    }


def pooled_spread(groups: list[list[float]], log: bool = False) -> tuple[float, int] | None:
    """The seed-to-seed standard deviation pooled over configurations run on the same seeds,
    and its degrees of freedom (sum of n - 1); ``log``: of the values' logarithms. Values to
    target are read at validations, so a few seeds often give one value on each, and that
    configuration's own spread is 0 though a new seed lands elsewhere; the seeds' noise is the
    task's, which every configuration shares."""
    if log:
        groups = [[math.log(v) for v in g if v > 0] for g in groups]
    kept = [g for g in groups if len(g) >= 2]
    df = sum(len(g) - 1 for g in kept)
    if not df:
        return None
    variance = sum((len(g) - 1) * _sd(g) ** 2 for g in kept) / df
    return math.sqrt(variance), df


def _sd(values: list[float]) -> float:
    """The sample standard deviation (statistics.stdev's, in floats: the confirmation's
    simulations call it hundreds of thousands of times)."""
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def lattice_sd(*quanta: float) -> float:
    """The standard deviation that reading values at validations adds to a difference of
    them: each value is where the run crossed the target rounded up to the next validation,
    a uniform rounding of up to one quantum (variance quantum**2 / 12, Sheppard)."""
    return math.sqrt(sum(q * q for q in quanta) / 12)


def paired_gain(
    baseline: list[tuple[float, bool]],
    candidate: list[tuple[float, bool]],
    confidence: float,
    quantum: tuple[float, float] = (0.0, 0.0),
    spread: tuple[float, int] | None = None,
    first: int | None = None,
) -> dict:
    """The decision on per-seed ``(value, reached)`` of the baseline and a candidate (the
    candidate's seeds: the baseline's first ones, in order; a miss's value: what it ran).

    The differences' standard deviation is floored at the lattice's (:func:`lattice_sd` of
    ``quantum``: the baseline's and the candidate's gap between validations) and at
    ``spread`` (one configuration's seed-to-seed sd and its degrees of freedom, pooled:
    :func:`pooled_spread`; where it holds the spread, the test has its degrees of freedom): equal
    differences on a few seeds are common on the lattice and would otherwise give an interval
    of no width, and a pairing is credited with removing at most half the seeds' variance.
    ``p``: the one-sided p-value of "the candidate needs less"; ``p_looks``: (seeds, p) at
    each look from ``first`` seeds on (sequential.py corrects them for the looks and for the
    candidates compared)."""
    candidate = list(candidate)
    baseline = list(baseline)[: len(candidate)]
    if len(baseline) != len(candidate):
        raise ValueError("paired seeds: the candidate ran seeds the baseline did not")
    missed = [i for i, (_, ok) in enumerate(candidate) if not ok]
    differences = [c - b for (b, _), (c, _) in zip(baseline, candidate, strict=True)]
    floor = (lattice_sd(*quantum), 0)
    if spread and spread[0] > floor[0]:
        floor = spread
    found = {
        "differences": differences,
        "n": len(differences),
        "floor_sd": floor[0],
        "floor_df": floor[1],
        "interval": _floored_interval(differences, confidence, floor),
        "baseline_censored": [i for i, (_, ok) in enumerate(baseline) if not ok],
    }
    start = max(2, first or len(differences))
    found["p_looks"] = [
        (n, _p(mean, sd, n, *floor)) for n, mean, sd in _prefixes(differences) if n >= start
    ]
    found["p"] = found["p_looks"][-1][1] if found["p_looks"] else 1.0
    interval = found["interval"]
    if missed:
        return {**found, "verdict": MISSED, "missed_seeds": missed}
    if interval is None or interval["low"] is None:
        return {**found, "verdict": NOISE}
    if interval["high"] < 0:
        return {**found, "verdict": BETTER}
    if interval["low"] > 0 and not found["baseline_censored"]:
        return {**found, "verdict": WORSE}
    return {**found, "verdict": NOISE}


def one_sided_p(differences: list[float], floor: float = 0.0, floor_df: int = 0) -> float:
    """P(a mean difference this low or lower | no gain): Student's t on the differences with
    their standard deviation at least ``floor`` (with ``floor_df`` degrees of freedom where it
    holds, if more than the differences' own); 1.0 with fewer than two or no spread. Below
    (1 - confidence) / 2 exactly when the floored interval lies below 0."""
    if len(differences) < 2:
        return 1.0
    n, mean, sd = list(_prefixes(differences))[-1]
    return _p(mean, sd, n, floor, floor_df)


def _p(mean: float, own: float, n: int, floor: float, floor_df: int) -> float:
    sd, df = (own, n - 1) if own >= floor else (floor, max(floor_df, n - 1))
    if sd <= 0:
        return 1.0
    t = mean / (sd / math.sqrt(n))
    tail = (1 - two_sided(abs(t), df)) / 2
    return tail if t < 0 else 1 - tail


def _prefixes(values: list[float]):
    """(n, mean, standard deviation) of each prefix of two values or more (Welford's running
    sums: one pass, and exactly 0 for equal values)."""
    mean = squares = 0.0
    for n, value in enumerate(values, 1):
        step = value - mean
        mean += step / n
        squares += step * (value - mean)
        if n >= 2:
            yield n, mean, math.sqrt(max(0.0, squares) / (n - 1))


def _spread(values: list[float], floor: float, floor_df: int) -> tuple[float, int]:
    """The values' standard deviation and degrees of freedom, or the floor's if above."""
    own = _sd(values)
    return (own, len(values) - 1) if own >= floor else (floor, max(floor_df, len(values) - 1))


def _floored_interval(values: list[float], confidence: float, floor: tuple[float, int]):
    """The mean's t interval with the standard deviation at least ``floor`` (sd, df)."""
    if not values:
        return None
    mean = statistics.fmean(values)
    if len(values) < 2:
        return {"estimate": mean, "low": None, "high": None, "n": 1, "confidence": confidence}
    sd, df = _spread(values, *floor)
    half = t_quantile(confidence, df) * sd / math.sqrt(len(values))
    return {
        "estimate": mean,
        "low": mean - half,
        "high": mean + half,
        "n": len(values),
        "confidence": confidence,
    }


def pick(decisions: dict[str, dict], means: dict[str, float]) -> str | None:
    """The candidate with the fewest mean samples among those ``better`` than the baseline."""
    better = [name for name, d in decisions.items() if d["verdict"] == BETTER]
    return min(better, key=lambda name: means[name]) if better else None


def ratio_interval(baseline: list[float], candidate: list[float], confidence: float):
    """Mean per-seed log ratio candidate / baseline as a ratio with its t interval (the
    candidate's seeds: the baseline's first ones; the baseline may have run more)."""
    pairs = zip(baseline[: len(candidate)], candidate, strict=True)
    logs = [math.log(c / b) for b, c in pairs if b > 0 and c > 0]
    found = mean_interval(logs, confidence)
    if found is None:
        return None
    return {
        "estimate": math.exp(found["estimate"]),
        "low": None if found["low"] is None else math.exp(found["low"]),
        "high": None if found["high"] is None else math.exp(found["high"]),
    }
