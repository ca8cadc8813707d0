"""Decisions on paired seeds: a candidate joins the recipe only when its gain holds seed by seed.

Samples to target are exact and repeat for the same seed (on a CPU), so the noise they carry
is the seed's, not the machine's. A candidate and the baseline run on the same seeds; the
gain is the mean of the per-seed differences (candidate - baseline) with Student's t interval
(``autotune.confidence``). It is ``better`` only when the interval lies below 0, ``worse``
when above, else ``not significant`` (the recipe stays). A candidate that misses the target
in a seed cannot be accepted. A baseline that misses it in a seed counts at the samples it ran
(a lower bound of its samples to target): the candidate's difference is then at least what is
stated, so the decision stays on the safe side.

Pure Python: unit-tested on given per-seed samples (tests/test_autotune_study.py).
"""

from __future__ import annotations

import math
import statistics

from tuneup.autotune.interval import t_quantile

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
    return {"estimate": mean, "low": low, "high": mean + half, "n": len(values),
            "confidence": confidence}  # fmt: skip


def prediction_interval(
    values: list[float],
    confidence: float,
    floor: float | None = None,
    spread: tuple[float, int] | None = None,
):
    """Where one more seed's value falls (Student's t prediction interval: the mean's
    interval widened by sqrt(1 + 1/n)); what a re-run on a seed the search never saw should
    land in. None with fewer than two values. ``spread``: a standard deviation and its degrees
    of freedom to use instead of the values' own (:func:`pooled_spread`)."""
    if len(values) < 2:
        return None
    mean = statistics.fmean(values)
    sd, df = spread or (statistics.stdev(values), len(values) - 1)
    half = t_quantile(confidence, df) * sd * math.sqrt(1 + 1 / len(values))
    low = mean - half if floor is None else max(floor, mean - half)
    return {"estimate": mean, "low": low, "high": mean + half, "n": len(values),
            "confidence": confidence}  # fmt: skip


def pooled_spread(groups: list[list[float]]) -> tuple[float, int] | None:
    """The seed-to-seed standard deviation pooled over configurations run on the same seeds,
    and its degrees of freedom (sum of n - 1). Samples to target are read at validations, so
    three seeds often give one value three times (960, 960, 960 on python_source), and that
    configuration's own interval has no width, though re-runs on new seeds gave 960, 1,280 and
    1,600; the seeds' noise is the task's, which every configuration shares."""
    kept = [g for g in groups if len(g) >= 2]
    df = sum(len(g) - 1 for g in kept)
    if not df:
        return None
    variance = sum((len(g) - 1) * statistics.variance(g) for g in kept) / df
    return math.sqrt(variance), df


def paired_gain(
    baseline: list[tuple[float, bool]], candidate: list[tuple[float, bool]], confidence: float
) -> dict:
    """The decision on per-seed ``(samples, reached)`` of the baseline and a candidate (same
    seeds, same order; a miss's samples: what it ran)."""
    if len(baseline) != len(candidate):
        raise ValueError("paired seeds: the baseline and the candidate ran different seeds")
    missed = [i for i, (_, ok) in enumerate(candidate) if not ok]
    differences = [c - b for (b, _), (c, _) in zip(baseline, candidate, strict=True)]
    interval = mean_interval(differences, confidence)
    found = {"differences": differences, "interval": interval,
             "baseline_censored": [i for i, (_, ok) in enumerate(baseline) if not ok]}  # fmt: skip
    if missed:
        return {**found, "verdict": MISSED, "missed_seeds": missed}
    if interval is None or interval["low"] is None:
        return {**found, "verdict": NOISE}
    if interval["high"] < 0:
        return {**found, "verdict": BETTER}
    if interval["low"] > 0 and not found["baseline_censored"]:
        return {**found, "verdict": WORSE}
    return {**found, "verdict": NOISE}


def pick(decisions: dict[str, dict], means: dict[str, float]) -> str | None:
    """The candidate with the fewest mean samples among those ``better`` than the baseline."""
    better = [name for name, d in decisions.items() if d["verdict"] == BETTER]
    return min(better, key=lambda name: means[name]) if better else None


def ratio_interval(baseline: list[float], candidate: list[float], confidence: float):
    """Mean per-seed log ratio candidate / baseline as a ratio with its t interval."""
    logs = [math.log(c / b) for b, c in zip(baseline, candidate, strict=True) if b > 0 and c > 0]
    found = mean_interval(logs, confidence)
    if found is None:
        return None
    return {
        "estimate": math.exp(found["estimate"]),
        "low": None if found["low"] is None else math.exp(found["low"]),
        "high": None if found["high"] is None else math.exp(found["high"]),
    }
