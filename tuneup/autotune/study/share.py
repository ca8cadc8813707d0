"""The time-to-target study's share of ``autotune.budget_minutes`` between its stages, as
the runs go (time_to_target.py): the arithmetic is study/budget.py's plain functions, this is
the search's view of it (its baseline, its trials, its clock)."""

from __future__ import annotations

from tuneup import TuneupError
from tuneup.autotune.study import budget as study_budget

#: autotune.md's note when the budget keeps no room for the speed stage's rounds.
SEEDS_TIME_IT = (
    "the budget holds no interleaved speed rounds beside one study trial and a confirmation: "
    "the pick's seconds per step against your command's come from their runs on the paired "
    "seeds, one at a time"
)


class BudgetShare:
    """Mixed into StudySearch: reads ``settings``, ``budget``, ``baseline``, ``lab``,
    ``confirm_seeds``, ``confirm_count``, ``confirm_added``, ``answered``, ``_released``,
    ``notes``, ``before``, ``workers``, ``speed_rounds`` and ``explored()``."""

    def left(self) -> float:
        return self.budget.seconds - self.budget.elapsed

    def typical_seconds(self) -> float:
        """A race trial's expected seconds: the median of the study's trials so far (or the
        baseline's)."""
        seconds = sorted(t.seconds for t in self.lab.trials if t.label != "speed") or [
            self.baseline.get("seconds", 1.0)
        ]
        return seconds[len(seconds) // 2]

    def trials_left(self) -> int:
        """Study trials ``autotune.budget_trials`` still allows."""
        return max(0, self.settings.budget_trials - len(self.explored()))

    def share_budget(self) -> None:
        """Refuse a budget too small for one study trial and one confirmation, or size the
        confirmation's room to it (study/budget.py), once the baseline's time is known."""
        s = self.settings
        rounds = self.keep_rounds()
        self.confirm_count, self.confirm_added = study_budget.plan(
            s.budget_minutes,
            self.budget.elapsed,
            self.baseline.get("seconds", 1.0),
            self.confirm_seconds(),
            len(self.confirm_seeds),
            s.confirm,
            rounds,
            self.trials_left(),
            self.before,
            s.max_seeds,
        )
        seeds = len(self.confirm_seeds) + self.confirm_added
        if (self.confirm_count, seeds) != (s.confirm, max(s.max_seeds, len(self.confirm_seeds))):
            self.notes.append(
                f"the budget holds the confirmation of {self.confirm_count} candidate(s) "
                f"(autotune.confirm={s.confirm}), the leading one on up to {seeds} seeds "
                f"(autotune.max_seeds={s.max_seeds})"
            )

    def study_need(self) -> float:
        """Seconds the study still needs (one study trial and the confirmation of one
        candidate, study/budget.py: minutes_needed) once its baseline has run; a budget too
        small for them is refused here, before any later run."""
        s = self.settings
        run_s, trials_left = self.confirm_seconds(), self.trials_left()
        args = (len(self.confirm_seeds), self.keep_rounds(), trials_left)
        refusal = study_budget.too_small(
            s.budget_minutes, self.budget.elapsed, self.baseline.get("seconds", 1.0), run_s, *args
        )
        if refusal:
            raise TuneupError(refusal)
        return study_budget.minutes_needed(self.budget.elapsed, run_s, *args)[0]

    def keep_rounds(self) -> int:
        """The speed stage's rounds the confirmation keeps room for (study/budget.py:
        rounds_kept): ``autotune.min_rounds``, or none where they do not fit and the
        confirmation's own runs time the pick (the notes say so)."""
        s = self.settings
        need, _ = study_budget.minutes_needed(
            self.budget.elapsed,
            self.confirm_seconds(),
            len(self.confirm_seeds),
            s.min_rounds,
            self.trials_left(),
            self.before,
        )
        rounds = study_budget.rounds_kept(
            s.budget_seconds - self.budget.elapsed,
            need,
            s.min_rounds,
            seeds_time_it=not self.workers.shared_cores,
        )
        if rounds == 0 and SEEDS_TIME_IT not in self.notes:
            self.notes.append(SEEDS_TIME_IT)
        elif rounds and SEEDS_TIME_IT in self.notes:
            self.notes.remove(SEEDS_TIME_IT)
        self.speed_rounds = rounds
        return rounds

    def speed_reserve(self) -> float:
        """The speed stage's first rounds kept (:meth:`keep_rounds`; more rounds while the
        budget allows)."""
        return study_budget.speed_seconds(self.speed_rounds, self.confirm_seconds())

    def reserve(self) -> float:
        """Room kept for confirm and speed (study_budget.explore_reserve; none once the
        answer is given, study/explore.py: go_on). A confirm run is
        taken at ``autotune.race_margin`` x its expected seconds: your command runs to the
        target on seeds the search never saw, which may need more steps than the search seed
        (a candidate's runs there are capped at that margin of your command's samples), and
        the room is kept before any of them has run."""
        seeds, run_s, rounds = (
            len(self.confirm_seeds),
            self.confirm_seconds() * self.settings.race_margin,
            self.speed_rounds,
        )
        if self.answered:  # the answer is given: what it left is the study's
            return 0.0
        found = any(t.user_attrs.get("reached") for t in self.explored())
        released = self._released
        room, self._released = study_budget.explore_reserve(
            self.left(),
            self.typical_seconds(),
            study_budget.room_seconds(self.confirm_count, seeds, self.confirm_added, run_s, rounds),
            study_budget.room_seconds(1, seeds, 0, run_s, rounds),
            found,
            released,
        )
        if self._released and not released:
            self.notes.append(
                "no study trial had reached the target when the minutes left were "
                "the confirmation's: the study went on with them"
            )
        return room

    def confirm_seconds(self) -> float:
        """A confirm run's expected seconds: a run to the target, as the baseline's (the
        study's median trial is a pruned one, far shorter)."""
        return max(self.typical_seconds(), self.baseline.get("seconds", 1.0))
