"""The time-to-target study's budget (tuneup/autotune/study/budget.py, issue 50 item 5): the
minutes go to the answer. Made-up times, no clock: each test runs in milliseconds."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tuneup import TuneupError
from tuneup.autotune.settings import Settings
from tuneup.autotune.speed.search import Budget
from tuneup.autotune.study import budget as study_budget
from tuneup.autotune.study.share import SEEDS_TIME_IT
from tuneup.autotune.time_to_target import StudySearch
from tuneup.autotune.trials import BASELINE, Trial


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
    max_seeds=8,
    undecided=0,
    accepted=True,
) -> dict:
    """The search's stages on a made-up clock, sharing the minutes as time_to_target.py does:
    the baseline, study trials while explore_limit allows, then as many candidates as fit on
    the paired seeds, the leading one on ``undecided`` seeds more, and, when it is
    ``accepted``, its held-out run and the speed stage's rounds while they fit; then the
    study again while it has trials left (study/explore.py: go_on)."""
    budget, clock = minutes * 60, baseline_s
    run_s = max(baseline_s, trial_s)
    k, added = study_budget.candidates_that_fit(
        budget - clock, confirm, seeds, run_s, rounds, max_seeds
    )
    reserve = study_budget.room_seconds(k, seeds, added, run_s, rounds)
    done, released = 0, False
    while done < trials:
        found = done >= first_hit  # a trial has reached the target: something to confirm
        room, released = study_budget.explore_reserve(
            budget - clock,
            trial_s,
            reserve,
            study_budget.room_seconds(1, seeds, 0, run_s, rounds),
            found,
            released,
        )
        if not study_budget.explore_limit(budget - clock, room, trial_s):
            break
        clock, done = clock + trial_s, done + 1
    if done < first_hit:  # nothing to confirm
        return {"trials": done, "confirmed": 0, "seconds": clock, "k": k, "added": added}
    confirmed, after = 0, 0
    held = run_s + study_budget.speed_seconds(rounds, run_s)  # the held-out run, the speed
    for _ in range(k + 1):  # the command, then the candidates, while they fit
        if budget - clock - held < seeds * run_s:
            break
        clock, confirmed = clock + seeds * run_s, confirmed + 1
    for _ in range(undecided):  # the leading candidate and the command on one seed more
        if budget - clock - held < 2 * run_s:
            break
        clock += 2 * run_s
    if accepted and budget - clock >= held:
        clock += run_s
        for _ in range(most_rounds):  # more than the reserved rounds while they fit
            if budget - clock < 2 * max(1.0, run_s / 2):
                break
            clock += 2 * max(1.0, run_s / 2)
    while done + after < trials and study_budget.goes_on(budget - clock, trial_s, trials):
        clock, after = clock + trial_s, after + 1
    return {
        "trials": done,
        "confirmed": confirmed - 1,
        "seconds": clock,
        "k": k,
        "added": added,
        "after": after,
    }


@pytest.mark.parametrize("minutes", [2, 3, 5, 8, 10, 15, 30])
@pytest.mark.parametrize("baseline_s,trial_s", [(3.0, 1.5), (8.0, 4.0), (10.0, 10.0)])
@pytest.mark.parametrize("accepted,undecided", [(True, 0), (False, 0), (False, 5)])
def test_the_minutes_are_spent_within_ten_percent_with_study_trials(
    minutes, baseline_s, trial_s, accepted, undecided
):
    """Whenever the study has trials left, the search ends within 10 % of its minutes, with at
    least one study trial and at least one candidate confirmed, whether a candidate is
    accepted or not and however many seeds decide it (digits' baseline takes seconds: a
    2-minute budget is not left unspent with 0 trials)."""
    run = simulate(
        minutes, baseline_s, trial_s, trials=10**6, accepted=accepted, undecided=undecided
    )
    assert run["trials"] >= 1 and run["confirmed"] >= 1
    assert 0.9 * minutes * 60 <= run["seconds"] <= 1.1 * minutes * 60


def test_a_candidate_found_after_the_release_keeps_one_candidates_room():
    assert study_budget.explore_reserve(100.0, 10.0, 80.0, 40.0, False, False) == (80.0, False)
    assert study_budget.explore_reserve(85.0, 10.0, 80.0, 40.0, False, False) == (0.0, True)
    assert study_budget.explore_reserve(85.0, 10.0, 80.0, 40.0, True, False) == (80.0, False)
    assert study_budget.explore_reserve(60.0, 10.0, 80.0, 40.0, True, True) == (40.0, True)


def test_a_tight_budget_confirms_fewer_candidates_rather_than_none():
    wide = study_budget.candidates_that_fit(30 * 60, 3, 3, 10.0, 2)
    tight = study_budget.candidates_that_fit(2 * 60, 3, 3, 10.0, 2)
    assert (wide, tight) == ((3, 0), (1, 0))
    assert simulate(2, 10.0, 5.0)["k"] == 1 and simulate(30, 10.0, 5.0)["k"] == 3


def test_the_room_holds_the_seeds_added_for_the_leading_candidate():
    """A run to the target at 7.5 s (digits' 5 s x race_margin), 3 paired seeds, up to 8:
    each candidate's 3 seeds, the leader's 5 seeds more with the command's (10 runs), the
    held-out run, then 2 speed rounds of two half-runs (15 s)."""
    assert study_budget.room_seconds(3, 3, 5, 7.5, 2) == (12 + 10 + 1) * 7.5 + 15
    # 10 minutes: three candidates and every seed up to 8 (187.5 s of the 590 s left)
    assert study_budget.candidates_that_fit(590.0, 3, 3, 7.5, 2, max_seeds=8) == (3, 5)
    # 5 minutes: the candidates shrink first, the leader keeps its seeds (142.5 s of 290 s)
    assert study_budget.candidates_that_fit(290.0, 3, 3, 7.5, 2, max_seeds=8) == (1, 5)
    # 4 minutes: one candidate, as many added seeds as fit (3: 112.5 s of 125 s)
    assert study_budget.candidates_that_fit(250.0, 3, 3, 7.5, 2, max_seeds=8) == (1, 3)
    # 2 minutes: one candidate on the paired seeds, the study goes on (not stopped)
    assert study_budget.candidates_that_fit(115.0, 3, 3, 7.5, 2, max_seeds=8) == (1, 0)
    assert simulate(2, 5.0, 5.0)["trials"] >= 1


def test_the_study_goes_on_after_the_answer_only_with_trials_and_a_trials_time_left():
    assert study_budget.goes_on(30.0, 10.0, trials_left=1)
    assert not study_budget.goes_on(30.0, 10.0, trials_left=0)
    assert not study_budget.goes_on(9.0, 10.0, trials_left=5)


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
        "one study trial and a confirmation need about 12 more minute(s); give at least "
        "autotune.budget_minutes=16"
    )
    assert "\n" not in str(refused.value)


def test_a_budget_that_holds_them_sizes_the_confirmation():
    """2 minutes, a 3 s baseline: one candidate, the leader's seeds up to 8 (57 s of the
    117 s left); 30 minutes: three, and the note says nothing was cut; 19 minutes at 95 s:
    one candidate on the paired seeds only, and autotune.md's notes say so."""
    search = search_after_baseline(2, 3.0)
    search.share_budget()
    assert (search.confirm_count, search.confirm_added) == (1, 5)
    search = search_after_baseline(30, 3.0)
    search.share_budget()
    assert (search.confirm_count, search.confirm_added, search.notes) == (3, 5, [])
    search = search_after_baseline(19, 95.0)
    search.share_budget()
    assert (search.confirm_count, search.confirm_added) == (1, 0)
    assert search.notes == [
        "the budget holds the confirmation of 1 candidate(s) (autotune.confirm=3), the "
        "leading one on up to 3 seeds (autotune.max_seeds=8)"
    ]


class ClockLab:
    """A lab whose runs take ``run_s`` seconds of an injected clock (no wall clock): each
    reaches the target in 10 steps and writes no file."""

    def __init__(self, now: list[float], run_s: float, sweep_dir) -> None:
        self.now, self.run_s, self.sweep_dir = now, run_s, sweep_dir
        self.trials: list[Trial] = []
        self.alone = ([], "")

    def run(self, label, overrides, steps=None, limit_s=None, settings=None, worker=None):
        self.now[0] += self.run_s
        summary = {
            "status": "ok",
            "target": {"reached": True, "value": 0.9, "mode": "max"},
            "target_history": [{"step": 10, "samples": 100, "value": 0.9}],
            "steps_to_target": 10,
            "samples_to_target": 100,
            "effective_batch_size": 10,
        }
        job = str(len(self.trials))
        trial = Trial(label, tuple(overrides), job, self.sweep_dir / job, summary, self.run_s)
        self.trials.append(trial)
        return trial


def test_what_the_answer_leaves_goes_back_to_the_study(tmp_path):
    """A 2-minute search on an injected clock, runs of 4 s: the study stops with the
    confirmation's room left; the confirmation is decided on its 3 paired seeds and keeps the
    command (no held-out run, no speed stage): the study goes on with what that left while
    it has trials, and the search ends within a trial's time of its minutes."""
    settings = Settings(
        objective="time_to_target", budget_minutes=2, budget_trials=1000, cost="steps"
    )
    now = [0.0]
    lab = ClockLab(now, 4.0, tmp_path / "sweep")
    budget = Budget(settings.budget_seconds, clock=lambda: now[0])
    accept = SimpleNamespace(inspect=lambda overrides: SimpleNamespace(ok=True, problems=()))
    search = StudySearch(settings, lab, accept, budget, 0, str(tmp_path / "optuna.journal"))
    search.user_config = {"optimizer": {"lr": 0.01}}
    search.space = SimpleNamespace(
        sample=lambda t: {"optimizer.lr": t.suggest_float("optimizer.lr", 0.05, 1.0, log=True)},
        overrides=lambda values: tuple(f"{k}={v}" for k, v in values.items()),
    )
    search.open_study()
    search.baseline = {"trial_samples": 150, "samples_to_target": 100, "seconds": 4.0}
    now[0] = 4.0  # the baseline has run
    search.share_budget()
    search.explore()
    room = search.reserve()
    assert room > 0 and budget.seconds - budget.elapsed < room + 4.0  # the room is kept
    studied = len(search.explored())
    now[0] += 2 * 3 * 4.0  # the command and one candidate on 3 seeds: the command kept
    search.go_on()
    assert len(search.explored()) > studied
    assert budget.seconds - 4.0 < budget.elapsed <= budget.seconds
    assert search.notes[-1].startswith("the answer left ") and search.notes[-1].endswith(
        f"of the 2 minute(s) of autotune.budget_minutes: the study went on with them, {len(search.explored()) - studied} more trial(s), "
        "kept in the study for a continued search (not confirmed)"
    )


def test_where_the_speed_rounds_do_not_fit_the_paired_seeds_time_the_pick():
    """A baseline of 13 s with 107 s left: a study trial, the command and one candidate on 3
    seeds (91 s) fit, 2 speed rounds more (26 s) do not: no room is kept for them, unless
    the workers share the cores (their runs' own times do not compare): then all of it."""
    need, _ = study_budget.minutes_needed(13.0, 13.0, 3, 2, 100)
    assert need == 117.0
    assert study_budget.rounds_kept(107.0, need, 2) == 0
    assert study_budget.rounds_kept(107.0, need, 2, seeds_time_it=False) == 2
    assert study_budget.rounds_kept(167.0, need, 2) == 2  # 3 minutes hold them
    assert study_budget.too_small(2, 13.0, 13.0, 13.0, 3, 0, 100) is None
    assert study_budget.too_small(2, 13.0, 13.0, 13.0, 3, 2, 100) is not None


def test_a_tight_budget_is_taken_with_the_seeds_timing_the_pick_and_says_so():
    search = search_after_baseline(2, 13.0)
    search.share_budget()
    assert search.speed_rounds == 0 and search.speed_reserve() == 0.0
    assert SEEDS_TIME_IT in search.notes
    shared = search_after_baseline(2, 13.0)
    shared.workers = SimpleNamespace(shared_cores=True)
    with pytest.raises(TuneupError, match=r"give at least autotune\.budget_minutes=3$"):
        shared.share_budget()
    roomy = search_after_baseline(10, 13.0)
    roomy.share_budget()
    assert roomy.speed_rounds == 2 and roomy.speed_reserve() == 26.0
    assert SEEDS_TIME_IT not in roomy.notes


def _run(steps: int, samples_per_s: float) -> Trial:
    summary = {
        "status": "ok",
        "samples_per_s_windows": [samples_per_s],
        "target": {"reached": True},
        "target_history": [{"step": steps, "samples": steps * 10, "value": 0.9}],
        "steps_to_target": steps,
        "samples_to_target": steps * 10,
        "effective_batch_size": 10,
    }
    return Trial("x", (), "0", None, summary, 1.0)


def test_without_a_round_the_pick_is_timed_on_its_paired_seeds_runs():
    """No time left for a speed round: the pick's seconds per step against the command's are
    its runs' on the paired seeds (the pick 2x as fast in samples/s on every seed, same
    batch), and the time ratio decides on them; with the workers sharing the cores, nothing
    is timed (the command is kept)."""
    from tuneup.autotune.confirm.speed import SEEDS, Speed

    settings = Settings(objective="time_to_target", seeds=3)
    base = {"overrides": (), "trials": [_run(40, 100.0), _run(44, 110.0), _run(42, 90.0)]}
    pick = {"overrides": ("a=1",), "trials": [_run(20, 200.0), _run(22, 230.0), _run(21, 170.0)]}
    search = SimpleNamespace(
        settings=settings,
        confirmed={BASELINE: base},
        batch=lambda overrides: 10,
        left=lambda: 0.0,
        typical_seconds=lambda: 5.0,
        workers=SimpleNamespace(shared_cores=False),
        notes=[],
    )
    speed = Speed(search, pick).run()
    assert speed.source == SEEDS and speed.trials == []
    assert speed.pairs == [(100.0, 200.0), (110.0, 230.0), (90.0, 170.0)]
    assert speed.ratio()["estimate"] == pytest.approx((100 / 200 * 110 / 230 * 90 / 170) ** (1 / 3))
    assert speed.time_ratio()["verdict"] == "faster"
    assert search.notes[-1].startswith("speed: 0 interleaved round(s) fit in the budget")
    search.workers, search.notes = SimpleNamespace(shared_cores=True), []
    assert Speed(search, pick).run().pairs == []


def test_the_first_candidates_seeds_may_use_the_timings_and_held_out_runs_share():
    """A tight budget: the first candidate's first seeds keep nothing back for the speed
    rounds and the held-out run (without them there is no answer; the timing falls back on
    the paired seeds' runs, the held-out run is left out with a note); your command's runs,
    a seed added and the next candidates keep both, as do all runs on shared cores."""
    from tuneup.autotune.confirm.seeds import _kept_for

    search = SimpleNamespace(
        speed_reserve=lambda: 26.0,
        confirm_seconds=lambda: 13.0,
        workers=SimpleNamespace(shared_cores=False),
    )
    entries = {BASELINE: {"trials": ["s1", "s2", "s3"]}, "a": {"trials": []}, "b": {"trials": []}}
    assert _kept_for(search, entries, "a", 0) == 0.0
    assert _kept_for(search, entries, BASELINE, 0) == 39.0
    entries["a"]["trials"] = ["s1", "s2", "s3"]
    assert _kept_for(search, entries, "b", 0) == 39.0
    assert _kept_for(search, entries, "a", 3) == 39.0
    entries["a"]["trials"] = []
    search.workers = SimpleNamespace(shared_cores=True)
    assert _kept_for(search, entries, "a", 0) == 39.0
