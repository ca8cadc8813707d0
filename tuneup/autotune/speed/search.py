"""The search: the recipe so far, one dimension at a time, candidates measured interleaved with it.

::

    baseline trial          the user's command: a warm-up of the process (its speed is not
                            compared) and the accuracy guard's reference curve
    for each dimension      autotune.dimensions, in order (batch_size: speed/batch.py)
        never launched      candidates the checks refuse or that change nothing here (space.py)
        rounds              the recipe so far (R) and each candidate left, once each, the
                            order reversed every round: R A B, B A R, R A B ... so load that
                            drifts over a round hits everyone alike on average
        leaves early        at its first trial that fails or that the guard rejects
                            (speed/guard.py); when no later rounds, however fast, could make its
                            interval exclude 1.0 within autotune.max_rounds (a candidate 10x
                            slower leaves after one round); after autotune.min_rounds, when
                            its interval is decided; at autotune.max_rounds
        accepted            the candidate with the highest speed-up among those whose
                            interval (interval.paired) lies above 1.0; it joins the recipe
    confirmation            the baseline against the final recipe, interleaved: the speed-up
                            the answer and the projection state (a recipe of one step: the
                            rounds that accepted it, which were against the baseline)

The budget (``autotune.budget_minutes``) decides which trials of a round are started and how
long each may run: budget.py (:class:`~.budget.Budget`, and the estimates, :class:`~.budget.Costs`).
"""

from __future__ import annotations

from tuneup import TuneupError
from tuneup.autotune.settings import BATCH, Settings
from tuneup.autotune.space import Candidate, Checks, half_weights, why_not
from tuneup.autotune.speed import batch as batches
from tuneup.autotune.speed.budget import FIRST_COMPILE_S, Budget, Costs, compiles
from tuneup.autotune.speed.guard import loss_gap, rejection
from tuneup.autotune.speed.outcome import (
    ACCEPTED,
    NOT_TRIED,
    REJECTED,
    Contest,
    Outcome,
    first_too_long,
    verdict,
)
from tuneup.autotune.trials import BASELINE, Lab, Trial, label
from tuneup.stats.interval import NOISE, can_still_win

# Budget and FIRST_COMPILE_S live in budget.py; the tests import them from here too.
__all__ = ["FIRST_COMPILE_S", "Budget", "Search"]


class Search(Costs):
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
        self.walk()
        self.confirm()
        return self

    def walk(self) -> None:
        """Each of autotune.dimensions in turn, while the budget allows the recipe's trial and
        the room kept for the rest: its candidates pruned, the rest decided."""
        for index, dimension in enumerate(self.settings.dimensions):
            self.dimension_index = index
            if not self.budget.allows(self._reserve() + self.estimate(self.recipe)):
                self.not_tried(dimension, "the budget ran out before this dimension")
                continue
            kept = self.prune(self.candidates(dimension))
            if kept:
                self.decide(kept)

    def candidates(self, dimension: str) -> list[Candidate]:
        if dimension == BATCH:
            return batches.BatchSearch(self).candidates()
        return [Candidate(dimension, overrides) for overrides in self.settings.space[dimension]]

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
            outcome = verdict(contest, against, self.settings.confidence, self.settings.max_rounds)
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

    def not_tried(self, dimension: str, reason: str) -> None:
        self.outcomes.append(Outcome(dimension, (), label(self.recipe), NOT_TRIED, reason))

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
                if number == 0 and candidate not in affordable:
                    why = self._first_too_long(reference, candidate, affordable, reserve)
                    contests[candidate].unaffordable = why
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

    def _first_too_long(self, reference, candidate: Candidate, affordable, reserve: bool) -> str:
        """Why ``candidate``'s first round did not fit: what :meth:`_affordable` left for it."""
        overrides = reference + candidate.overrides
        left = self.budget.seconds - self.budget.elapsed - (self._reserve() if reserve else 0)
        left -= self.estimate(reference) + sum(
            self.estimate(reference + c.overrides) for c in affordable
        )
        return first_too_long(self.estimate(overrides), left, compiles(overrides))

    def _round(self, reference, order, contests, active) -> None:
        """One round, in ``order``; a trial whose expected time no longer fits in what is left
        (the machine slowed down since the round was planned) is not started: its candidate
        is cut short, and without the reference's trial the round ends there."""
        speeds: dict = {}
        for candidate in order:
            overrides = reference + (candidate.overrides if candidate else ())
            if not self.budget.allows(self.estimate(overrides)):
                for cut in [candidate] if candidate else list(active):
                    contests[cut].cut_short = True
                    active.remove(cut)
                if candidate is None:
                    break
                continue
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
