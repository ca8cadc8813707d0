"""What became of each candidate of the search (tuneup/autotune/speed/search.py): its rounds
against the recipe so far (:class:`Contest`) and the verdict recorded for the path
(:class:`Outcome`, :func:`verdict`), read by autotune.json and autotune.md."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from tuneup.autotune.space import Candidate
from tuneup.autotune.trials import Trial
from tuneup.stats.interval import FASTER, SLOWER, Interval, paired

ACCEPTED, REJECTED, NOT_TRIED = "accepted", "rejected", "not tried"


@dataclass
class Outcome:
    """What became of one candidate: the path's record."""

    dimension: str
    candidate: tuple[str, ...]  # its own overrides
    against: str  # the recipe it was measured against (its label)
    verdict: str  # accepted | rejected | refused | skipped | not tried
    reason: str = ""
    interval: Interval | None = None
    trials: list[Trial] = field(default_factory=list)
    loss_gap: float | None = None
    reference_trials: list[Trial] = field(default_factory=list)

    @property
    def label(self) -> str:
        return " ".join(self.candidate) or self.dimension

    @property
    def peak_memory_bytes(self) -> float | None:
        return median_peak(self.trials)

    @property
    def reference_peak_memory_bytes(self) -> float | None:
        """The recipe's peak in the same rounds: on a CPU under the basic launcher a trial's
        peak resident set includes what earlier trials left in the process, so only trials
        run side by side compare."""
        return median_peak(self.reference_trials)


@dataclass
class Contest:
    """One candidate's rounds against the recipe so far."""

    candidate: Candidate
    pairs: list[tuple[float, float]] = field(default_factory=list)  # (reference, candidate)
    trials: list[Trial] = field(default_factory=list)
    reference_trials: list[Trial] = field(default_factory=list)  # of the same rounds
    failure: str | None = None
    gap: float | None = None
    cut_short: bool = False  # the budget ended its rounds
    hopeless: bool = False  # no later rounds could have made it faster beyond the noise
    #: Why its first round did not fit, where the budget had seconds left (first_too_long).
    unaffordable: str | None = None

    def interval(self, confidence: float) -> Interval | None:
        if not self.pairs:
            return None
        reference, candidate = zip(*self.pairs, strict=True)
        return paired(list(reference), list(candidate), confidence)


def first_too_long(expected_s: float, left_s: float, compiled: bool) -> str:
    """Why a candidate never ran while the budget had time left: its first trial's expected
    seconds (a first compile: a minute at least, its compilation uncut by any time limit)."""
    why = " (a first compile is planned at a minute at least)" if compiled else ""
    return (
        f": its first trial was expected to take {expected_s:.0f} s{why}, more than the "
        f"{max(0.0, left_s):.0f} s left for it"
    )


def median_peak(trials: list[Trial]) -> float | None:
    peaks = [
        t.figure("peak_memory_bytes") for t in trials if t.ok and t.figure("peak_memory_bytes")
    ]
    return statistics.median(peaks) if peaks else None


def verdict(contest: Contest, against: str, confidence: float, max_rounds: int) -> Outcome:
    """The outcome of a candidate's rounds: accepted only when its interval lies above 1.0."""
    candidate = contest.candidate
    outcome = Outcome(
        candidate.dimension,
        candidate.overrides,
        against,
        REJECTED,
        trials=contest.trials,
        loss_gap=contest.gap,
        reference_trials=contest.reference_trials,
    )
    outcome.interval = contest.interval(confidence)
    interval = outcome.interval
    if contest.failure:
        outcome.reason = contest.failure
    elif interval is None:
        outcome.verdict = NOT_TRIED
        outcome.reason = "the budget ran out before its first round" + (contest.unaffordable or "")
    elif interval.verdict == FASTER:
        outcome.verdict, outcome.reason = ACCEPTED, f"faster: {interval}"
    elif interval.verdict == SLOWER:
        outcome.reason = f"slower: {interval}"
    elif contest.hopeless:
        outcome.reason = (
            f"{interval.estimate:.3g}x after {interval.repeats} round(s): no later rounds could "
            f"make it faster beyond the noise within autotune.max_rounds={max_rounds}"
        )
    else:
        short = ", the budget ended its rounds" if contest.cut_short else ""
        outcome.reason = f"not faster beyond the noise: {interval}{short}"
    return outcome
