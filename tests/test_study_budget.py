"""The time-to-target study's budget (tuneup/autotune/study/budget.py, issue 50 item 5): the
minutes go to the answer. Made-up times, no clock: each test runs in milliseconds."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tuneup import TuneupError
from tuneup.autotune.settings import Settings
from tuneup.autotune.speed.search import Budget
from tuneup.autotune.study import budget as study_budget
from tuneup.autotune.time_to_target import StudySearch


def simulate(
    minutes: float,
    baseline_s: float,
    trial_s: float,
    seeds=3,
    confirm=3,
    rounds=2,
    most_rounds=4,
    trials=100,
    first_hit=1,
) -> dict:
    """The search's stages on a made-up clock, sharing the minutes as time_to_target.py does:
    the baseline, study trials while explore_limit allows, then as many candidates as fit
    on the paired seeds, then the speed stage's rounds while they fit."""
    budget, clock = minutes * 60, baseline_s
    run_s = max(baseline_s, trial_s)
    k = study_budget.candidates_that_fit(budget - clock, confirm, seeds, run_s, rounds)
    reserve = study_budget.confirm_seconds(k, seeds, run_s, rounds)
    done, released = 0, False
    while done < trials:
        found = done >= first_hit  # a trial has reached the target: something to confirm
        room, released = study_budget.explore_reserve(
            budget - clock,
            trial_s,
            reserve,
            study_budget.confirm_seconds(1, seeds, run_s, rounds),
            found,
            released,
        )
        if not study_budget.explore_limit(budget - clock, room, trial_s):
            break
        clock, done = clock + trial_s, done + 1
    if done < first_hit:  # nothing to confirm
        return {"trials": done, "confirmed": 0, "seconds": clock, "k": k}
    confirmed = 0
    for _ in range(confirm + 1):  # the command, then the candidates, while they fit
        cost = seeds * run_s
        if budget - clock - study_budget.speed_seconds(rounds, run_s) < cost:
            break
        clock, confirmed = clock + cost, confirmed + 1
    for _ in range(most_rounds):  # more than the reserved rounds while they fit
        if budget - clock < 2 * max(1.0, run_s / 2):
            break
        clock += 2 * max(1.0, run_s / 2)
    return {"trials": done, "confirmed": confirmed - 1, "seconds": clock, "k": k}


@pytest.mark.parametrize("minutes", [2, 3, 5, 8, 10, 15, 30])
@pytest.mark.parametrize("baseline_s,trial_s", [(3.0, 1.5), (8.0, 4.0), (10.0, 10.0)])
def test_the_minutes_are_spent_within_ten_percent_with_study_trials(minutes, baseline_s, trial_s):
    """Whenever the study has trials left, the search ends within 10 % of its minutes, with at
    least one study trial and at least one candidate confirmed (digits' baseline takes
    seconds: a 2-minute budget is not left unspent with 0 trials)."""
    run = simulate(minutes, baseline_s, trial_s, trials=10**6)  # trials left throughout
    assert run["trials"] >= 1 and run["confirmed"] >= 1
    assert 0.9 * minutes * 60 <= run["seconds"] <= 1.1 * minutes * 60


@pytest.mark.parametrize("minutes", [2, 8])
def test_with_nothing_to_confirm_the_study_goes_on_with_the_confirmations_minutes(minutes):
    """No study trial reaches the target before the confirmation's room is all that is left:
    the study spends it rather than stopping with the minutes unused."""
    run = simulate(minutes, 10.0, 10.0, trials=10**6, first_hit=10**6)
    assert run["seconds"] >= 0.9 * minutes * 60 and run["seconds"] <= minutes * 60


def test_a_candidate_found_after_the_release_keeps_one_candidates_room():
    assert study_budget.explore_reserve(100.0, 10.0, 80.0, 40.0, False, False) == (80.0, False)
    assert study_budget.explore_reserve(85.0, 10.0, 80.0, 40.0, False, False) == (0.0, True)
    assert study_budget.explore_reserve(85.0, 10.0, 80.0, 40.0, True, False) == (80.0, False)
    assert study_budget.explore_reserve(60.0, 10.0, 80.0, 40.0, True, True) == (40.0, True)


def test_a_tight_budget_confirms_fewer_candidates_rather_than_none():
    wide = study_budget.candidates_that_fit(30 * 60, 3, 3, 10.0, 2)
    tight = study_budget.candidates_that_fit(2 * 60, 3, 3, 10.0, 2)
    assert (wide, tight) == (3, 1)
    assert simulate(2, 10.0, 5.0)["k"] == 1 and simulate(30, 10.0, 5.0)["k"] == 3


def test_another_seed_only_while_it_and_the_speed_stage_fit():
    # 2 candidates and the command on one more seed (3 x 10 s) + 2 speed rounds (2 x 2 x 5 s)
    assert study_budget.another_seed(50.0, 2, 10.0, 2)
    assert not study_budget.another_seed(49.0, 2, 10.0, 2)


def test_explore_stops_when_the_minutes_left_are_the_confirmations():
    assert study_budget.explore_limit(100.0, 60.0, 10.0) == 40.0
    assert study_budget.explore_limit(65.0, 60.0, 10.0) == 0.0


def test_the_least_budget_is_one_trial_and_one_confirmation():
    # baseline 95 s: a study trial (95) + the command and one candidate on 3 seeds (6 x 95)
    # + 2 speed rounds of two half-runs (2 x 2 x 47.5): 855 s after the baseline's 95
    need, least = study_budget.minutes_needed(95.0, 95.0, 3, 2, trials_left=5)
    assert need == 855.0 and least == 19  # 950 s, and a fifth to spare: 1,140 s
    assert study_budget.minutes_needed(95.0, 95.0, 3, 2, trials_left=0)[0] == 760.0
    # after a speed stage of 60 s that may take a third of the budget: the study's 950 s are
    # two thirds of the least budget (1,425 s), a fifth to spare: 1,710 s
    assert study_budget.minutes_needed(155.0, 95.0, 3, 2, 5, before=(60.0, 1 / 3))[1] == 29
    refusal = study_budget.too_small(10, 155.0, 95.0, 95.0, 3, 2, 5, before=(60.0, 1 / 3))
    assert refusal.startswith(
        "autotune.budget_minutes=10 is too small for this command: its baseline took 95 s "
        "after the speed stage's 60 s;"
    ) and refusal.endswith("give at least autotune.budget_minutes=29")


def search_after_baseline(minutes: float, baseline_s: float) -> StudySearch:
    settings = Settings(objective="time_to_target", budget_minutes=minutes, seeds=3)
    now = [0.0]
    search = StudySearch(
        settings,
        SimpleNamespace(trials=[]),
        None,
        Budget(settings.budget_seconds, clock=lambda: now[0]),
        0,
        "unused",
    )
    search.baseline = {"seconds": baseline_s}
    search.explored = lambda: []
    now[0] = baseline_s  # the baseline has run
    return search


def test_a_budget_too_small_for_one_trial_and_a_confirmation_is_refused_with_the_minutes():
    with pytest.raises(TuneupError) as refused:
        search_after_baseline(2, 95.0).share_budget()
    assert str(refused.value) == (
        "autotune.budget_minutes=2 is too small for this command: its baseline took 95 s; "
        "one study trial and a confirmation need about 15 more minute(s); give at least "
        "autotune.budget_minutes=19"
    )
    assert "\n" not in str(refused.value)


def test_a_budget_that_holds_them_sizes_the_confirmation():
    search = search_after_baseline(2, 3.0)
    search.share_budget()
    assert search.confirm_count == 3
    search = search_after_baseline(19, 95.0)
    search.share_budget()
    assert search.confirm_count == 1
