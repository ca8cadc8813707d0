"""The time to target of the pick against the user's command: one ratio, one interval.

Time to target = optimizer steps to the target x seconds per optimizer step + the
validations' seconds. The two factors carry independent noise and are measured apart:

- the **steps** (and the validations) on the paired seeds: the same seeds for both sides,
  exact counts, read at validations;
- the **seconds per step** in short interleaved throughput rounds (confirm/speed.py): one
  ratio pick / command per round, of trials run next to each other.

They are combined on the log scale, where a ratio of products is a sum. Seed i gives

    d_i = log((steps_pick_i x r x s + validation_pick_i) / (steps_command_i x s + validation_command_i))

with s the command's seconds per step and r the seconds-per-step ratio (the rounds' mean log
ratio, exponentiated): the time ratio the seed would show at the measured speeds. The
estimate is exp(mean d). Its variance is the seeds' (var(d) / n, n - 1 degrees of freedom)
plus the rounds' (var(log r) / m, m - 1), the latter weighted by w^2, w = the pick's training
share of its time (d log T / d log r: validations do not get faster with the step). The
degrees of freedom of the sum are Welch-Satterthwaite's, and the interval is Student's t
with them, so the verdict is read from the very ratio that is reported.

Counts read at validations repeat: three seeds often give one value three times, and a
spread of 0 would give an interval of no width. Each count is known only to within its
validation interval q (a uniform error, variance q^2 / 12), so the seeds' variance of d is
floored at the mean of (q_pick / steps_pick)^2 / 12 + (q_command / steps_command)^2 / 12.

Pure Python (tests/test_time_ratio.py).
"""

from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import dataclass

from tuneup.stats.interval import t_quantile

FASTER, SLOWER, NOISE = "faster", "slower", "not significant"


@dataclass(frozen=True)
class Seed:
    """One configuration's run on one paired seed."""

    steps: float  # optimizer steps to the target (a miss: the steps it ran)
    validation_s: float = 0.0  # the validations' seconds up to there
    quantum: float = 0.0  # steps between two validations: the count's resolution


def time_ratio(
    command: list[Seed],
    pick: list[Seed],
    rounds: list[tuple[float, float]],
    confidence: float,
) -> dict | None:
    """Time to target, pick / command, with its interval and verdict.

    ``command``, ``pick``: the paired seeds, in the same order. ``rounds``: (command's, pick's)
    seconds per optimizer step of each interleaved round. None without a seed or a round;
    one seed or one round: the estimate without an interval (not significant)."""
    pairs = [(c, p) for c, p in zip(command, pick, strict=True) if c.steps > 0 and p.steps > 0]
    logs = [math.log(p / c) for c, p in rounds if c > 0 and p > 0]
    if not pairs or not logs:
        return None
    step_s = statistics.median(c for c, p in rounds if c > 0 and p > 0)
    log_r = statistics.fmean(logs)
    ratio = math.exp(log_r)
    d = [math.log(_time(p, ratio * step_s) / _time(c, step_s)) for c, p in pairs]
    share = statistics.fmean(_train_share(p, ratio * step_s) for _, p in pairs)
    found = {
        "estimate": math.exp(statistics.fmean(d)),
        "low": None,
        "high": None,
        "confidence": confidence,
        "seeds": len(d),
        "rounds": len(logs),
        "step_ratio": ratio,
        "steps_ratio": _steps_ratio(pairs),
        "df": None,
    }
    if len(d) < 2 or len(logs) < 2:
        return {**found, "verdict": NOISE}
    floor = statistics.fmean(
        ((p.quantum / p.steps) ** 2 + (c.quantum / c.steps) ** 2) / 12 for c, p in pairs
    )
    seeds = max(statistics.variance(d), floor) / len(d)
    speed = share**2 * statistics.variance(logs) / len(logs)
    if seeds + speed == 0:
        return {**found, "verdict": NOISE}
    df = (seeds + speed) ** 2 / (seeds**2 / (len(d) - 1) + speed**2 / (len(logs) - 1))
    whole = max(1, math.floor(df + 1e-9))  # t_quantile takes whole df: rounded down, wider
    half = t_quantile(confidence, whole) * math.sqrt(seeds + speed)
    mean = statistics.fmean(d)
    low, high = math.exp(mean - half), math.exp(mean + half)
    verdict = FASTER if high < 1 else SLOWER if low > 1 else NOISE
    return {**found, "low": low, "high": high, "df": df, "verdict": verdict}


def _time(seed: Seed, step_s: float) -> float:
    return seed.steps * step_s + seed.validation_s


def _train_share(seed: Seed, step_s: float) -> float:
    return seed.steps * step_s / _time(seed, step_s)


def _steps_ratio(pairs: list[tuple[Seed, Seed]]) -> float:
    """The steps' geometric mean ratio, pick / command (shown beside the time)."""
    return math.exp(statistics.fmean(math.log(p.steps / c.steps) for c, p in pairs))


def quantum(history: list[dict]) -> float:
    """Steps between two validations of a run's ``target_history`` (its first step when it
    validated once): the resolution of its steps to target."""
    steps = [entry["step"] for entry in history]
    gaps = [b - a for a, b in itertools.pairwise(steps) if b > a]
    return float(min(gaps) if gaps else steps[0] if steps else 0)
