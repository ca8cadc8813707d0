"""The search: the recipe so far, one dimension at a time, candidates measured interleaved with it.

::

    baseline trial          the user's command: a warm-up of the process (its speed is not
                            compared) and the accuracy guard's reference curve
    for each dimension      autotune.dimensions, in order (batch_size: batch.py)
        never launched      candidates the checks refuse or that change nothing here (space.py)
        rounds              the recipe so far (R) and each candidate left, once each, the
                            order reversed every round: R A B, B A R, R A B ... so load that
                            drifts over a round hits everyone alike on average
        leaves early        at its first trial that fails or that the guard rejects
                            (guard.py); when no later rounds, however fast, could make its
                            interval exclude 1.0 within autotune.max_rounds (a candidate 10x
                            slower leaves after one round); after autotune.min_rounds, when
                            its interval is decided; at autotune.max_rounds
        accepted            the candidate with the highest speed-up among those whose
                            interval (interval.paired) lies above 1.0; it joins the recipe
    confirmation            the baseline against the final recipe, interleaved: the speed-up
                            the answer and the projection state (a recipe of one step: the
                            rounds that accepted it, which were against the baseline)

The budget (``autotune.budget_minutes``, wall time from the sweep's start): a round takes
the reference and the candidates (cheapest first) whose expected trials, plus the
confirmation's, fit in what is left; extra rounds beyond the minimum also leave room for
the later dimensions' minimum. A trial's expected cost is the median of its
configuration's last three trials, or the reference's scaled by the batch size for a new
one, so a first compile can overrun by its compile time (never beyond the trial's time
limit, :meth:`Search.time_limit`). A dimension the budget does not reach is not tried.
"""

from __future__ import annotations

import re
import statistics
import time
from dataclasses import dataclass, field

from tuneup import TuneupError
from tuneup.autotune import batch as batches
from tuneup.autotune.guard import loss_gap, rejection
from tuneup.autotune.interval import FASTER, NOISE, SLOWER, Interval, can_still_win, paired
from tuneup.autotune.settings import BATCH, Settings
from tuneup.autotune.space import Candidate, Checks, half_weights, why_not
from tuneup.autotune.trials import Lab, Trial

BASELINE = "baseline"
MIN_TRIAL_LIMIT_S = 60.0
ACCEPTED, REJECTED, NOT_TRIED = "accepted", "rejected", "not tried"


def label(overrides: tuple[str, ...]) -> str:
    return " ".join(overrides) or BASELINE


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

    def interval(self, confidence: float) -> Interval | None:
        if not self.pairs:
            return None
        reference, candidate = zip(*self.pairs, strict=True)
        return paired(list(reference), list(candidate), confidence)


def median_peak(trials: list[Trial]) -> float | None:
    peaks = [
        t.figure("peak_memory_bytes") for t in trials if t.ok and t.figure("peak_memory_bytes")
    ]
    return statistics.median(peaks) if peaks else None


class Budget:
    def __init__(self, seconds: float, clock=time.monotonic) -> None:
        self.seconds, self.clock, self.started = seconds, clock, clock()

    @property
    def elapsed(self) -> float:
        return self.clock() - self.started

    def allows(self, seconds: float) -> bool:
        return self.seconds - self.elapsed >= seconds


class Search:
    def __init__(self, settings: Settings, lab: Lab, checks: Checks, budget: Budget) -> None:
        self.settings, self.lab, self.checks, self.budget = settings, lab, checks, budget
        self.recipe: tuple[str, ...] = ()
        self.outcomes: list[Outcome] = []
        self.batch_notes: list[str] = []
        self.baseline: Trial | None = None
        self.confirmation: Contest | None = None
        self.dimension_index = 0

    # -- the path ---------------------------------------------------------------------------

    def run(self) -> Search:
        self.baseline = self.lab.run(BASELINE, ())
        if not self.baseline.ok:
            raise TuneupError(
                f"the baseline trial (your command as it is) failed: {self.baseline.error}; "
                f"see {self.baseline.directory}; the autotune needs a command that trains"
            )
        for index, dimension in enumerate(self.settings.dimensions):
            self.dimension_index = index
            if not self.budget.allows(self._reserve() + self.estimate(self.recipe)):
                self.not_tried(dimension, "the budget ran out before this dimension")
                continue
            if dimension == BATCH:
                candidates = batches.BatchSearch(self).candidates()
            else:
                space = self.settings.space[dimension]
                candidates = [Candidate(dimension, overrides) for overrides in space]
            kept = self.prune(candidates)
            if kept:
                self.decide(kept)
        self.confirm()
        return self

    def prune(self, candidates: list[Candidate]) -> list[Candidate]:
        """The candidates that may be launched; the others are recorded with the reason."""
        reference = self.checks.inspect(self.recipe)
        kept, inspected = [], {}
        for candidate in candidates:
            inspection = self.checks.inspect(self.recipe + candidate.overrides)
            why = half_weights(inspection, reference, self.settings.allow_half_weights)
            why = why or why_not(inspection, reference, inspected, candidate.changes_precision)
            if why is not None:
                verdict, reason = why
                self.outcomes.append(
                    Outcome(
                        candidate.dimension,
                        candidate.overrides,
                        label(self.recipe),
                        verdict,
                        reason,
                    )
                )
                continue
            kept.append(candidate)
            inspected[candidate.label] = inspection
        return kept

    def decide(self, candidates: list[Candidate]) -> None:
        """Measure the candidates against the recipe so far; the best one claimed joins it."""
        against = label(self.recipe)
        contests = self.rounds(self.recipe, candidates, self.settings.max_rounds)
        winners = []
        for contest in contests:
            outcome = self._outcome(contest, against)
            self.outcomes.append(outcome)
            if outcome.verdict == ACCEPTED:
                winners.append((outcome, contest))
        if not winners:
            return
        best, contest = max(winners, key=lambda pair: pair[0].interval.estimate)
        for outcome, _ in winners:
            if outcome is not best:
                outcome.verdict = REJECTED
                outcome.reason = f"faster, but `{best.label}` is more so ({best.interval})"
        if not self.recipe:  # measured against the baseline: the confirmation, if it stays alone
            self.confirmation = contest
        self.recipe = self.recipe + best.candidate

    def confirm(self) -> None:
        """The final recipe against the baseline: the speed-up the answer states. A recipe of
        one step was measured against the baseline already: those rounds are its answer."""
        if not self.recipe or self.confirmation.candidate.overrides == self.recipe:
            return
        contest = Candidate("confirmation", self.recipe)
        [self.confirmation] = self.rounds((), [contest], self.settings.max_rounds, reserve=False)

    # -- rounds -----------------------------------------------------------------------------

    def rounds(
        self, reference: tuple[str, ...], candidates: list[Candidate], max_rounds: int, reserve=True
    ) -> list[Contest]:
        """Interleaved rounds of the reference and the candidates (see the module docstring)."""
        contests = {c: Contest(c) for c in candidates}
        active = list(candidates)
        for number in range(max_rounds):
            active = [c for c in active if self._another_round(contests[c], number, max_rounds)]
            affordable = self._affordable(reference, active, number, reserve)
            for candidate in active:
                contests[candidate].cut_short = candidate not in affordable
            active = affordable
            if not active:
                break
            order = [None, *active][:: -1 if number % 2 else 1]  # None: the reference
            self._round(reference, order, contests, active)
        return [contests[c] for c in candidates]

    def _another_round(self, contest: Contest, number: int, max_rounds: int) -> bool:
        """Whether the candidate gets round ``number`` (0-based)."""
        confidence = self.settings.confidence
        if contest.pairs and not can_still_win(contest.pairs, max_rounds, confidence):
            contest.hopeless = True  # no later rounds could make it faster beyond the noise
            return False
        if number < self.settings.min_rounds:
            return True
        interval = contest.interval(confidence)
        return interval is not None and interval.verdict == NOISE

    def _affordable(self, reference, active: list[Candidate], number: int, reserve: bool):
        """The candidates whose trials, with the reference's, fit in the budget, cheapest first."""
        left = self.budget.seconds - self.budget.elapsed - (self._reserve() if reserve else 0)
        if number >= self.settings.min_rounds:
            left -= self._later_cost()  # extra rounds leave room for the later dimensions
        left -= self.estimate(reference)
        chosen = []
        for candidate in sorted(active, key=lambda c: self.estimate(reference + c.overrides)):
            left -= self.estimate(reference + candidate.overrides)
            if left < 0:
                break
            chosen.append(candidate)
        return [c for c in active if c in chosen]

    def _round(self, reference, order, contests, active) -> None:
        speeds: dict = {}
        for candidate in order:
            overrides = reference + (candidate.overrides if candidate else ())
            trial = self.lab.run(label(overrides), overrides, limit_s=self.time_limit(overrides))
            if candidate is None:
                speeds[None] = trial.speed
                for c in (c for c in order if c is not None):
                    contests[c].reference_trials.append(trial)
                continue
            contest = contests[candidate]
            contest.trials.append(trial)
            contest.failure = self._judge(trial, contest)
            if contest.failure:
                active.remove(candidate)
            else:
                speeds[candidate] = trial.speed
        for candidate, speed in speeds.items():
            if candidate is not None and speeds.get(None) and speed:
                contests[candidate].pairs.append((speeds[None], speed))

    def _judge(self, trial: Trial, contest: Contest) -> str | None:
        """Why a candidate's trial rules it out: it failed, or the guard rejects its loss."""
        if not trial.ok:
            return f"its trial failed (job {trial.job}): {trial.error}"
        if trial.speed is None:
            return f"its trial measured no speed (job {trial.job}): raise autotune.trial_steps"
        base, curve = self.baseline.figure("loss_curve"), trial.figure("loss_curve")
        if base and curve:
            contest.gap = max(contest.gap or 0.0, loss_gap(base, curve)[0])
        return rejection(base, curve, self.settings.loss_tolerance)

    def _outcome(self, contest: Contest, against: str) -> Outcome:
        candidate = contest.candidate
        outcome = Outcome(candidate.dimension, candidate.overrides, against, REJECTED,
                          trials=contest.trials, loss_gap=contest.gap,
                          reference_trials=contest.reference_trials)  # fmt: skip
        outcome.interval = contest.interval(self.settings.confidence)
        interval = outcome.interval
        if contest.failure:
            outcome.reason = contest.failure
        elif interval is None:
            outcome.verdict, outcome.reason = NOT_TRIED, "the budget ran out before its first round"
        elif interval.verdict == FASTER:
            outcome.verdict, outcome.reason = ACCEPTED, f"faster: {interval}"
        elif interval.verdict == SLOWER:
            outcome.reason = f"slower: {interval}"
        elif contest.hopeless:
            outcome.reason = (
                f"{interval.estimate:.3g}x after {interval.repeats} round(s): no later rounds could "
                f"make it faster beyond the noise within autotune.max_rounds={self.settings.max_rounds}"
            )
        else:
            short = ", the budget ended its rounds" if contest.cut_short else ""
            outcome.reason = f"not faster beyond the noise: {interval}{short}"
        return outcome

    # -- the budget -------------------------------------------------------------------------

    def time_limit(self, overrides: tuple[str, ...]) -> float:
        """A trial's limit: autotune.trial_time_factor x the baseline's trial (x the batch
        factor), at least a minute (a first compile). A candidate that slow cannot be the
        fastest; what it ran is measured."""
        times = [t.seconds for t in self.lab.trials[1:] if t.label == BASELINE]
        typical = statistics.median(times or [self.baseline.seconds])
        factor = self.settings.trial_time_factor * self._batch_factor(overrides, ())
        return max(MIN_TRIAL_LIMIT_S, factor * typical)

    def estimate(self, overrides: tuple[str, ...]) -> float:
        """Expected seconds of one trial of this configuration (see the module docstring)."""
        own = self._recent_seconds(label(overrides))
        if own:
            return statistics.median(own)
        reference = self._recent_seconds(label(self.recipe)) or [
            t.seconds for t in self.lab.trials[:1]
        ]
        base = statistics.median(reference) if reference else 0.0
        return base * self._batch_factor(overrides, self.recipe)

    def _recent_seconds(self, name: str) -> list[float]:
        """The last three trials' seconds of a configuration: the machine's load now, not
        at the start (the first trial also paid the process's start-up)."""
        return [t.seconds for t in self.lab.trials[1:] if t.label == name][-3:]

    def _batch_factor(self, overrides: tuple[str, ...], relative_to: tuple[str, ...]) -> float:
        """The batch of ``overrides`` over the batch of ``relative_to`` (1.0 when unchanged)."""
        wanted = [
            int(m.group(1)) for o in overrides if (m := re.fullmatch(r"data\.batch_size=(\d+)", o))
        ]
        current = (self.checks.inspect(relative_to).config or {}).get("data", {}).get("batch_size")
        return wanted[-1] / current if wanted and isinstance(current, int) and current else 1.0

    def _reserve(self) -> float:
        """Room kept for the confirmation (its rounds of the baseline and the recipe), needed
        once the recipe has a step: a second one makes it a recipe of two."""
        return self.settings.min_rounds * 2 * self.estimate(()) if self.recipe else 0.0

    def _later_cost(self) -> float:
        """The later dimensions' minimum: what extra rounds must leave room for (two trials
        per round, a guess: their candidates are not known yet)."""
        later = len(self.settings.dimensions) - self.dimension_index - 1
        return later * self.settings.min_rounds * 2 * self.estimate(self.recipe)

    def not_tried(self, dimension: str, reason: str) -> None:
        self.outcomes.append(Outcome(dimension, (), label(self.recipe), NOT_TRIED, reason))
