"""Paired seeds added one at a time while undecided, and the decisions corrected for it.

The time-to-target study's confirmation (confirm/seeds.py) runs the baseline and each
candidate on ``autotune.seeds`` paired seeds, then adds one seed at a time, up to
``autotune.max_seeds``, to the candidates still undecided: not yet accepted, not missed or
worse, and still able to win (:func:`can_still_win`), as the throughput objective's rounds
are added (interval.can_still_win). A clear candidate costs few seeds; a close one gets the
seeds that can settle it.

Looking after every seed and comparing several candidates with one baseline are both
multiple tests; each would let a candidate no better than the baseline through more often
than the confidence says. The decisions are therefore corrected twice:

- looks (weighted Bonferroni, as Haybittle and Peto's interim analyses): the last look, at
  ``max_seeds`` seeds, gets :data:`LAST_SHARE` of the level, the earlier looks share the
  rest equally; a candidate's p-value for the looks is the least over its looks of its
  p-value over its look's share. Valid for any stopping rule, since every look it could
  have had is counted; most of the level stays where the evidence is most.
- candidates: Holm's step-down across the confirmed candidates (Holm 1979): the smallest
  p-value against level / m, the next against level / (m - 1), ..., stopping at the first
  that fails. The family-wise rate of false accepts stays within the level.

The level is one-sided (1 - ``autotune.confidence``) / 2: with one candidate and no seed to
add, a candidate is accepted exactly when its two-sided interval lies below 0.

Pure Python; the same functions run the study's confirmation and the tests' simulations
under the null on lattice data (tests/test_autotune_decisions.py).
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Callable

from tuneup.stats.interval import t_quantile
from tuneup.stats.paired import BETTER, MISSED, NOISE, WORSE, paired_gain, pooled_spread

BASELINE = "baseline"
#: What a trial gives the confirmation: (value to target, reached, lattice quantum)
Figure = tuple[float, bool, float]


def level(confidence: float) -> float:
    """The one-sided level of the family: (1 - confidence) / 2."""
    return (1 - confidence) / 2


#: The share of the level kept for the look at ``max_seeds`` seeds (the earlier looks share
#: the rest): early looks accept only a clear gain, the last one keeps most of the power.
LAST_SHARE = 0.75


def looks(seeds: int, max_seeds: int) -> int:
    """The looks a candidate can have: after ``seeds`` seeds, and after each one added."""
    return max(1, max_seeds - seeds + 1)


@functools.lru_cache(maxsize=1024)
def share(n: int, seeds: int, max_seeds: int) -> float:
    """The share of the level spent at the look after ``n`` seeds."""
    if looks(seeds, max_seeds) == 1:
        return 1.0
    return LAST_SHARE if n >= max_seeds else (1 - LAST_SHARE) / (looks(seeds, max_seeds) - 1)


def look_p(decision: dict, seeds: int, max_seeds: int) -> float:
    """A candidate's p-value corrected for its looks: the least of p / share over them."""
    found = [p / share(n, seeds, max_seeds) for n, p in decision.get("p_looks") or []]
    return min(1.0, min(found, default=1.0))


def holm(
    decisions: dict[str, dict], confidence: float, seeds: int = 1, max_seeds: int = 1
) -> dict[str, dict]:
    """The decisions with Holm's step-down across them (on :func:`look_p`): ``p_adjusted``
    on each, and ``better`` only where the corrected test accepts it (``corrected``: what the
    verdict was before, where the correction changed it)."""
    p = {name: look_p(d, seeds, max_seeds) for name, d in decisions.items()}
    ordered = sorted(decisions, key=p.get)
    m, found, running, failed = len(ordered), {}, 0.0, False
    for rank, name in enumerate(ordered):
        decision = decisions[name]
        running = max(running, min(1.0, p[name] * (m - rank)))  # step-down: never below
        accepted = not failed and running <= level(confidence)
        failed = failed or not accepted
        row = {**decision, "p_adjusted": running, "candidates": m, "looks": looks(seeds, max_seeds)}
        if decision["verdict"] in (MISSED, WORSE):
            found[name] = row
        elif accepted:
            found[name] = {**row, "verdict": BETTER}
        elif decision["verdict"] == BETTER:
            found[name] = {**row, "verdict": NOISE, "corrected": BETTER}
        else:
            found[name] = row
    return {name: found[name] for name in decisions}


def can_still_win(decision: dict, confidence: float, seeds: int, max_seeds: int) -> bool:
    """Whether seeds up to ``max_seeds`` could still give an accepting p-value, however the
    candidate does on them (at the most lenient of Holm's steps, the level times the look's
    share). For a given mean, seeds that agree leave the least spread, so the seeds left are
    taken at one common difference; the best such t is found in closed form
    (Cauchy-Schwarz), the differences' standard deviation held at least at the decision's
    floor."""
    gains = [-d for d in decision["differences"]]  # larger: better
    j = len(gains)
    if j == 0:
        return max_seeds >= 2
    mean = math.fsum(gains) / j
    spread = math.fsum((g - mean) ** 2 for g in gains)
    floor = decision.get("floor_sd") or 0.0
    for n in range(max(j + 1, 2), max_seeds + 1):
        alpha = level(confidence) * share(n, seeds, max_seeds)
        if _best_t(mean, spread, floor, j, n) > t_quantile(1 - 2 * alpha, n - 1):
            return True
    return False


def _best_t(a: float, w: float, floor: float, j: int, n: int) -> float:
    """The largest t over the common value of the n - j seeds added to j values with mean
    ``a`` and sum of squared deviations ``w``: with delta the added value less a, the mean is
    a + b delta and the sum of squares w + c delta**2 (b = k / n, c = j k / n)."""
    k = n - j
    b, c = k / n, j * k / n
    root_n = math.sqrt(n)
    best = -math.inf
    # where the floor holds the spread: t grows with delta up to the floor's edge
    edge2 = (floor**2 * (n - 1) - w) / c
    if edge2 >= 0 and floor > 0:
        best = root_n * (a + b * math.sqrt(edge2)) / floor
    if (
        a > 0 and w > 0
    ):  # the free optimum, delta = b w / (a c), where the spread is above the floor
        delta = b * w / (a * c)
        if delta * delta >= edge2:
            best = max(best, root_n * math.sqrt(n - 1) * math.sqrt(a * a / w + b * b / c))
    else:  # it rises toward its supremum as delta grows
        best = max(best, root_n * math.sqrt(n - 1) * b / math.sqrt(c))
    return best


def is_open(decision: dict, confidence: float, seeds: int, max_seeds: int, m: int) -> bool:
    """Whether a candidate gets one more seed: not missed, not worse, not yet accepted at the
    strictest of Holm's steps (level / m), and still able to win."""
    if decision["verdict"] in (MISSED, WORSE):
        return False
    if look_p(decision, seeds, max_seeds) * m <= level(confidence):
        return False
    return can_still_win(decision, confidence, seeds, max_seeds)


def decide_all(
    figures: dict[str, list[Figure]], confidence: float, seeds: int, max_seeds: int
) -> dict[str, dict]:
    """Every candidate's decision against ``figures[BASELINE]``, each with the differences'
    spread floored at the lattice and at the spread pooled over the configurations that
    reached the target on all their seeds, then corrected (:func:`holm`)."""
    base = figures[BASELINE]
    groups = [
        [v for v, _, _ in runs]
        for runs in figures.values()
        if runs and all(ok for _, ok, _ in runs)
    ]
    pooled = pooled_spread(groups)
    decisions = {}
    for name, runs in figures.items():
        if name == BASELINE or not runs:
            continue
        decisions[name] = paired_gain(
            [(v, ok) for v, ok, _ in base],
            [(v, ok) for v, ok, _ in runs],
            confidence,
            quantum=(_quantum(base[: len(runs)]), _quantum(runs)),
            spread=pooled,
            first=seeds,
        )
    return holm(decisions, confidence, seeds, max_seeds)


def run_seeds(
    run: Callable[[str, int], Figure | None],
    names: list[str],
    confidence: float,
    seeds: int,
    max_seeds: int,
    ahead: Callable[[list[tuple[str, int]]], None] = lambda runs: None,
) -> tuple[dict[str, list[Figure]], dict[str, dict]]:
    """The confirmation: ``run(name, i)`` runs a configuration (``BASELINE`` or a candidate)
    on the i-th paired seed and gives its :data:`Figure`, or None when the budget is spent
    (then nothing more is run). The baseline, then each candidate, on the first ``seeds``
    seeds; then one seed at a time, the baseline with the candidates still open
    (:func:`is_open`). ``ahead(runs)`` hears each round's ``(name, i)`` before they are run
    (to run them at once). Gives every configuration's figures and the corrected decisions."""
    figures: dict[str, list[Figure]] = {BASELINE: [], **{n: [] for n in names}}
    ahead([(name, i) for name in [BASELINE, *names] for i in range(seeds)])
    for name in [BASELINE, *names]:
        for i in range(seeds):
            found = run(name, i)
            if found is None:
                return figures, decide_all(figures, confidence, seeds, max_seeds)
            figures[name].append(found)
    decisions = decide_all(figures, confidence, seeds, max_seeds)
    for i in range(seeds, max_seeds):
        wanted = [
            n for n in names if is_open(decisions[n], confidence, seeds, max_seeds, len(names))
        ]
        if not wanted:
            break
        ahead([(name, i) for name in [BASELINE, *wanted]])
        for name in [BASELINE, *wanted]:
            found = run(name, i)
            if found is None:
                return figures, decide_all(figures, confidence, seeds, max_seeds)
            figures[name].append(found)
        decisions = decide_all(figures, confidence, seeds, max_seeds)
    return figures, decisions


def _quantum(runs: list[Figure]) -> float:
    quanta = [q for _, _, q in runs if q]
    return statistics.median(quanta) if quanta else 0.0
