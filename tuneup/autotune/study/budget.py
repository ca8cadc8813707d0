"""The time-to-target study's budget arithmetic: how ``autotune.budget_minutes`` is shared.

Plain functions of seconds and counts, so that they are tested with made-up times
(tests/test_study_budget.py) and the search (time_to_target.py) only asks them. The times they
take are the runs' own, measured as the search goes: ``run_s``, a run to the target (the
baseline's, or the study's median trial's if longer), which is what a confirmation run costs.

How the minutes are shared, once the baseline has run and its time is known:

- The confirmation gets its room (:func:`room_seconds`): ``k`` candidates and the command on
  the paired seeds, the seeds added one at a time while the leading candidate is undecided
  (it and the command on each, up to ``autotune.max_seeds``), the pick's run on the held-out
  seed, then the speed stage. ``k`` is the most of ``autotune.confirm`` whose room takes at
  most half of what is left after the baseline (at least 1); where even one candidate's
  does not fit, fewer seeds are added (:func:`plan`). A tight budget confirms fewer
  candidates on fewer seeds; it does not stop the study.
- The explore stage gets the rest: it runs while what is left exceeds that room by a trial's
  time, so the study ends when the minutes left are the minutes the confirmation needs. If
  no study trial has reached the target by then, there is nothing to confirm: the study goes
  on with that room too (:func:`explore_reserve`).
- What the answer leaves (a confirmation decided in fewer seeds than its room holds, no
  pick to run on the held-out seed and to time) goes back to the study while it has trials
  left (:func:`goes_on`): the minutes are spent whatever the answer.
- Where the speed stage's rounds do not fit beside one study trial and one candidate's
  confirmation, no room is kept for them (:func:`rounds_kept`): the pick is timed from the
  confirmation's own runs on the paired seeds (confirm/speed.py), which a tight budget pays
  for anyway. Not where the workers share the cores: their runs' own times do not compare.
- A budget in which one study trial and the confirmation of one candidate do not fit is
  refused as soon as the baseline's time says so, before any study trial, with the minutes
  it would need.
"""

from __future__ import annotations

import math

from tuneup import TuneupError

SPARE = 1.2  # the least budget advised: what is needed, and a fifth more


def speed_seconds(rounds: int, run_s: float) -> float:
    """The speed stage: ``rounds`` rounds of two short throughput trials (the command's and
    the pick's), each taken at half a run to the target (a few steps, but the same start-up)."""
    return 2 * rounds * max(1.0, run_s / 2)


def confirm_seconds(candidates: int, seeds: int, run_s: float, rounds: int) -> float:
    """Seconds the confirmation of ``candidates`` needs: they and the command on ``seeds``
    paired seeds, each run at ``run_s``, then the speed stage's ``rounds``."""
    return (candidates + 1) * seeds * run_s + speed_seconds(rounds, run_s)


def room_seconds(candidates: int, seeds: int, added: int, run_s: float, rounds: int) -> float:
    """The confirmation's room: ``candidates`` and the command on ``seeds`` paired seeds,
    ``added`` seeds more for the leading candidate (it and the command on each), the pick's
    run on the held-out seed, each at ``run_s``; then the speed stage's ``rounds``."""
    runs = (candidates + 1) * seeds + 2 * added + 1
    return runs * run_s + speed_seconds(rounds, run_s)


def candidates_that_fit(
    left_s: float, most: int, seeds: int, run_s: float, rounds: int, max_seeds: int | None = None
) -> tuple[int, int]:
    """(candidates, seeds added) of the confirmation's room: the most of ``most`` candidates
    whose room, with every seed up to ``max_seeds`` for the leading one, needs at most half
    of ``left_s`` (the other half at least goes to the study); where not even one fits, one
    candidate with the most added seeds that fit (at least none)."""
    added = max(0, (max_seeds or seeds) - seeds)
    fit = [
        k for k in range(1, most + 1) if room_seconds(k, seeds, added, run_s, rounds) <= left_s / 2
    ]
    if fit:
        return max(fit), added
    fewer = [a for a in range(added + 1) if room_seconds(1, seeds, a, run_s, rounds) <= left_s / 2]
    return 1, max(fewer, default=0)


def another_seed(left_s: float, candidates: int, run_s: float, rounds: int) -> bool:
    """Whether one more paired seed fits while the decision is open: ``candidates`` and the
    command on it, with the speed stage's ``rounds`` still after it."""
    return (candidates + 1) * run_s + speed_seconds(rounds, run_s) <= left_s


def explore_reserve(
    left_s: float, trial_s: float, need_s: float, need_one_s: float, found: bool, released: bool
) -> tuple[float, bool]:
    """(the room the study keeps now, whether it has been released). ``need_s``: the
    confirmation's room; ``need_one_s``: one candidate's; ``found``: a study trial has reached
    the target (there is something to confirm). The room is kept while the study has more
    than it and a trial left, or has a candidate. Reached with nothing to confirm, it is
    released: the study goes on with the rest (an idle reserve would answer nothing), and a
    candidate found after that keeps one candidate's room."""
    if not released and (found or left_s - trial_s >= need_s):
        return need_s, False
    return (need_one_s if found else 0.0), True


def explore_limit(left_s: float, reserve_s: float, trial_s: float) -> float:
    """The time limit of the next study trial: what is left above the confirmation's room;
    0 when that is less than a typical trial's time (the study stops there)."""
    limit = left_s - reserve_s
    return limit if limit >= trial_s else 0.0


def goes_on(left_s: float, trial_s: float, trials_left: int) -> bool:
    """Whether the study goes on once the answer is given: it has trials left and what the
    answer left holds a typical trial."""
    return trials_left > 0 and left_s >= trial_s


def minutes_needed(
    elapsed_s: float,
    run_s: float,
    seeds: int,
    rounds: int,
    trials_left: int,
    before: tuple[float, float] = (0.0, 0.0),
) -> tuple[float, int]:
    """(seconds still needed, the least ``autotune.budget_minutes``) for one study trial (none
    when the study has no trials left) and the confirmation of one candidate, after
    ``elapsed_s`` spent already (the baseline, and the stages before the study). ``before``:
    the seconds those stages took and the share of the budget they may take (the speed
    stage: a third), so that the least budget leaves the study its need whatever share
    they take of it. The least budget keeps a fifth to spare: a run's time varies from one
    search to the next on a shared machine."""
    need = (run_s if trials_left > 0 else 0.0) + confirm_seconds(1, seeds, run_s, rounds)
    spent, share = before
    least = max(elapsed_s + need, (elapsed_s - spent + need) / (1 - share))
    return need, math.ceil(SPARE * least / 60)


def too_small(
    budget_minutes: float,
    elapsed_s: float,
    baseline_s: float,
    run_s: float,
    seeds: int,
    rounds: int,
    trials_left: int,
    before: tuple[float, float] = (0.0, 0.0),
) -> str | None:
    """The one-line refusal when ``budget_minutes`` cannot hold one study trial and one
    confirmation after ``elapsed_s``; None when it can."""
    need, least = minutes_needed(elapsed_s, run_s, seeds, rounds, trials_left, before)
    if budget_minutes * 60 - elapsed_s >= need:
        return None
    what = "one study trial and a confirmation" if trials_left > 0 else "a confirmation"
    speed = f" after the speed stage's {before[0]:.0f} s" if before[0] else ""
    return (
        f"autotune.budget_minutes={budget_minutes:g} is too small for this command: its baseline "
        f"took {baseline_s:.0f} s{speed}; {what} need about {math.ceil(need / 60)} more minute(s); "
        f"give at least autotune.budget_minutes={least}"
    )


def rounds_kept(left_s: float, need_s: float, rounds: int, seeds_time_it: bool = True) -> int:
    """The speed stage's rounds the confirmation keeps room for: ``rounds``, or none when the
    ``left_s`` seconds do not hold ``need_s`` (:func:`minutes_needed` with those rounds: one
    study trial and one candidate's confirmation) and the confirmation's own runs can time the
    pick (``seeds_time_it``: they run one at a time; confirm/speed.py pairs them seed by seed
    then). With workers sharing the cores they cannot: ``rounds``."""
    return rounds if not seeds_time_it or left_s >= need_s else 0


def plan(
    budget_minutes: float,
    elapsed_s: float,
    baseline_s: float,
    run_s: float,
    seeds: int,
    most: int,
    rounds: int,
    trials_left: int,
    before: tuple[float, float] = (0.0, 0.0),
    max_seeds: int | None = None,
) -> tuple[int, int]:
    """(candidates, seeds added) of the confirmation's room (:func:`candidates_that_fit`),
    once the baseline has run; a budget too small for one trial and one confirmation is
    refused."""
    refusal = too_small(
        budget_minutes, elapsed_s, baseline_s, run_s, seeds, rounds, trials_left, before
    )
    if refusal:
        raise TuneupError(refusal)
    left = budget_minutes * 60 - elapsed_s
    return candidates_that_fit(left, most, seeds, run_s, rounds, max_seeds)
