"""The interval rule: a speed-up is claimed only when its confidence interval excludes 1.0.

Two ways to get the interval, for the two kinds of evidence a run leaves:

- :func:`paired`: repeated trials of a reference and a candidate, run interleaved in rounds
  (the autotune). Each round gives one ratio, candidate / reference, of trials run next to
  each other, so load on the machine that lasts longer than a round hits both. The interval
  is Student's t over the rounds' log ratios: the trials, not the steps inside them, are the
  independent repeats (steps of one process share its state and its neighbours' load;
  Kalibera and Jones, "Rigorous benchmarking in reasonable time", 2013). One slow trial
  makes the rounds disagree and the interval wide: no claim.
- :func:`welch`: one run each (a sweep report). Welch's t over the runs' speed windows
  (``samples_per_s_windows`` in summary.json). It covers the variation inside each run
  only; load that differs between the two runs is not in it, so the sweep report says so.

:func:`trial_speed` is what one trial measured: its fastest window. Other work on the
machine only ever slows a window down, never speeds it up, so the fastest window is the
closest to what the configuration itself costs (Chen and Revels, "Robust benchmarking in
noisy environments", 2016); the windows' spread is reported beside it.

Pure Python (no scipy, no torch): the report imports it in the sweep's process.
"""

from __future__ import annotations

import functools
import math
import statistics
from dataclasses import dataclass

FASTER, SLOWER, NOISE = "faster", "slower", "within noise"


@dataclass(frozen=True)
class Interval:
    """A speed ratio (candidate / reference) and its confidence interval."""

    estimate: float
    low: float
    high: float
    repeats: int  # rounds (paired) or windows of the smaller side (welch)
    confidence: float

    @property
    def verdict(self) -> str:
        """``faster`` or ``slower`` when the interval excludes 1.0, else ``within noise``."""
        return FASTER if self.low > 1 else SLOWER if self.high < 1 else NOISE

    def __str__(self) -> str:
        return f"{self.estimate:.3g}x [{self.low:.3g}, {_bound(self.high)}]"


def trial_speed(summary: dict | None) -> float | None:
    """The fastest speed window of a run (samples/s), or its samples_per_s without windows."""
    if not summary:
        return None
    windows = [w for w in summary.get("samples_per_s_windows") or [] if _positive(w)]
    speed = max(windows) if windows else summary.get("samples_per_s")
    return speed if _positive(speed) else None


def paired(reference: list[float], candidate: list[float], confidence: float) -> Interval | None:
    """The ratio candidate / reference over rounds (``reference[i]`` ran next to
    ``candidate[i]``); None without a complete round. One round: no interval (0 to inf)."""
    rounds = [
        (r, c) for r, c in zip(reference, candidate, strict=True) if _positive(r) and _positive(c)
    ]
    if not rounds:
        return None
    return _interval([math.log(c / r) for r, c in rounds], confidence)


def _interval(logs: list[float], confidence: float) -> Interval:
    """Student's t interval of the mean of log ratios, as a ratio."""
    mean = statistics.fmean(logs)
    if len(logs) < 2:
        return Interval(math.exp(mean), 0.0, math.inf, 1, confidence)
    half = t_quantile(confidence, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return Interval(
        math.exp(mean), math.exp(mean - half), math.exp(mean + half), len(logs), confidence
    )


def can_still_win(pairs: list[tuple[float, float]], rounds: int, confidence: float) -> bool:
    """Whether rounds up to ``rounds`` in all could still give an interval above 1.0, however
    the candidate does in the rounds left. For a given mean, later rounds that agree leave
    the least variance, so each later round is taken at one common ratio, scanned from 1/e
    to e**6: exact up to that grid. A candidate that cannot win is not measured again."""
    logs = [math.log(c / r) for r, c in pairs if _positive(r) and _positive(c)]
    left = rounds - len(logs)
    if left <= 0:
        return False
    for step in range(351):
        ratio = -1 + step * 0.02
        interval = _interval([*logs, *[ratio] * left], confidence)
        if interval.low > 1:
            return True
    return False


def welch(reference: list[float], candidate: list[float], confidence: float) -> Interval | None:
    """The ratio of two runs' mean log speeds over their windows (Welch's t); None with
    fewer than two windows on either side."""
    a = [math.log(w) for w in reference if _positive(w)]
    b = [math.log(w) for w in candidate if _positive(w)]
    if len(a) < 2 or len(b) < 2:
        return None
    diff = statistics.fmean(b) - statistics.fmean(a)
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    if va + vb == 0:
        return Interval(
            math.exp(diff), math.exp(diff), math.exp(diff), min(len(a), len(b)), confidence
        )
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))  # Welch-Satterthwaite
    half = t_quantile(confidence, max(1, math.floor(df))) * math.sqrt(va + vb)
    return Interval(
        math.exp(diff),
        math.exp(diff - half),
        math.exp(diff + half),
        min(len(a), len(b)),
        confidence,
    )


@functools.lru_cache(maxsize=256)
def t_quantile(confidence: float, df: int) -> float:
    """t such that P(|T| <= t) = ``confidence`` for Student's t with ``df`` degrees of freedom."""
    high = 1.0
    while two_sided(high, df) < confidence:
        high *= 2
    low = 0.0
    for _ in range(100):  # bisection: 2**-100 of the bracket
        middle = (low + high) / 2
        low, high = (middle, high) if two_sided(middle, df) < confidence else (low, middle)
    return (low + high) / 2


def two_sided(t: float, df: int) -> float:
    """P(|T| <= t), exact for whole ``df`` (Abramowitz and Stegun 26.7.3 and 26.7.4)."""
    theta = math.atan(t / math.sqrt(df))
    cos2, term = math.cos(theta) ** 2, 1.0
    if df % 2:  # odd: 2/pi (theta + sin cos (1 + 2/3 cos^2 + 2*4/(3*5) cos^4 + ...))
        total = 1.0 if df > 1 else 0.0
        for k in range(3, df - 1, 2):
            term *= cos2 * (k - 1) / k
            total += term
        return 2 / math.pi * (theta + math.sin(theta) * math.cos(theta) * total)
    total = 1.0  # even: sin (1 + 1/2 cos^2 + 1*3/(2*4) cos^4 + ...)
    for k in range(2, df - 1, 2):
        term *= cos2 * (k - 1) / k
        total += term
    return math.sin(theta) * total


def _positive(value) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value > 0


def _bound(value: float) -> str:
    return "inf" if math.isinf(value) else f"{value:.3g}"
