"""The time to target of the pick against the command (tuneup/stats/time_ratio.py): the
steps on paired seeds and the seconds per step of interleaved rounds combined on the log
scale, with Welch-Satterthwaite's degrees of freedom, validations and the lattice included."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from tuneup.autotune.confirm.seeds import decide
from tuneup.autotune.settings import Settings
from tuneup.autotune.study.trials import seed_figure, trial_cost, trial_value
from tuneup.autotune.trials import BASELINE, Trial
from tuneup.stats.interval import paired
from tuneup.stats.paired import BETTER
from tuneup.stats.time_ratio import FASTER, NOISE, Seed, quantum, time_ratio

NOISE_LOGS = (-0.1, 0.0, 0.1)


def test_two_factors_each_within_the_noise_are_faster_together():
    steps = [80 * math.exp(e) for e in NOISE_LOGS]  # 0.8x the steps, give or take 10 %
    step_s = [0.8 * math.exp(e) for e in NOISE_LOGS]  # 0.8x the seconds per step, likewise
    alone = paired([100.0] * 3, steps, 0.95), paired([1.0] * 3, step_s, 0.95)
    assert all(i.low < 1 < i.high for i in alone)  # neither factor is significant by itself
    found = time_ratio([Seed(100)] * 3, [Seed(s) for s in steps], [(1.0, s) for s in step_s], 0.95)
    # log 0.64 +- t(0.975, 4) x sqrt(0.01/3 + 0.01/3): df 4 by Welch-Satterthwaite
    assert found["estimate"] == pytest.approx(0.64)
    assert found["df"] == pytest.approx(4)
    half = 2.7764451 * math.sqrt(0.02 / 3)
    assert found["low"] == pytest.approx(0.64 * math.exp(-half), rel=1e-6)
    assert found["high"] == pytest.approx(0.64 * math.exp(half), rel=1e-6)
    assert found["high"] < 1
    assert found["verdict"] == FASTER
    assert found["steps_ratio"] == pytest.approx(0.8) and found["step_ratio"] == pytest.approx(0.8)


def test_counts_that_repeat_on_the_lattice_still_give_an_interval_with_width():
    # 30 and 40 steps on every seed, validations every 5 steps, equal round ratios: the
    # spread is 0, the lattice's is not: var = ((5/30)^2 + (5/40)^2) / 12 per seed
    found = time_ratio(
        [Seed(40, quantum=5)] * 3, [Seed(30, quantum=5)] * 3, [(1.0, 0.9), (1.0, 0.9)], 0.95
    )
    se = math.sqrt(((5 / 30) ** 2 + (5 / 40) ** 2) / 12 / 3)
    assert found["df"] == pytest.approx(2)
    assert found["low"] == pytest.approx(0.675 * math.exp(-4.3026527 * se), rel=1e-6)
    assert found["high"] == pytest.approx(0.675 * math.exp(4.3026527 * se), rel=1e-6)
    assert found["low"] < found["estimate"] < found["high"]


def test_validations_count_and_do_not_speed_up_with_the_step():
    # the command: 100 steps of 1 s + 50 s of validation; the pick: 50 steps + 50 s, at the
    # same speed give or take 10 % a round: 100 s / 150 s, the rounds' noise at half weight
    found = time_ratio(
        [Seed(100, 50.0)] * 2,
        [Seed(50, 50.0)] * 2,
        [(1.0, math.exp(-0.1)), (1.0, math.exp(0.1))],
        0.95,
    )
    assert found["estimate"] == pytest.approx(2 / 3, rel=1e-3)
    half = 12.7062047 * 0.5 * math.sqrt(0.02 / 2)  # t(0.975, 1) x w x se(log r), w = 1/2
    assert found["high"] == pytest.approx(2 / 3 * math.exp(half), rel=1e-3)
    assert found["verdict"] == NOISE


def test_one_round_or_one_seed_has_no_interval():
    one_round = time_ratio([Seed(40)] * 3, [Seed(20)] * 3, [(1.0, 1.0)], 0.95)
    assert one_round["low"] is None and one_round["verdict"] == NOISE
    assert one_round["estimate"] == pytest.approx(0.5)
    assert time_ratio([Seed(40)], [Seed(20)], [], 0.95) is None


def test_the_lattice_step_of_a_runs_history():
    assert quantum([{"step": 5}, {"step": 10}, {"step": 15}]) == 5
    assert quantum([{"step": 7}]) == 7 and quantum([]) == 0


# -- a trial's cost and the decision on it ----------------------------------------------------


def race_trial(
    steps: int,
    batch: int,
    step_s: float,
    validation_s: float = 1.0,
    reached=True,
    value: float = 0.8,
) -> Trial:
    """A race run's summary: ``steps`` of ``batch`` at ``step_s`` a step (its fastest window),
    validated every 5 steps."""
    history = [{"step": k, "samples": k * batch, "value": value} for k in range(5, steps + 1, 5)]
    train = steps * step_s * 1.5  # the run's clock: slower windows than its fastest
    summary = {
        "status": "ok",
        "effective_batch_size": batch,
        "target_history": history,
        "samples_per_s_windows": [batch / step_s / 2, batch / step_s],
        "target": {"reached": reached, "value": 0.9, "mode": "max"},
        "validation_time_s": validation_s,
        "fit_seconds": train + validation_s,
    }
    if reached:
        summary.update(
            steps_to_target=steps,
            samples_to_target=steps * batch,
            time_to_target_s=train + validation_s,
            time_to_target_train_s=train,
        )
    return Trial("t", (), "0", Path("."), summary, 1.0)


def test_a_trials_cost_is_its_steps_at_its_own_step_time_plus_its_validations():
    hit = race_trial(steps=40, batch=16, step_s=0.05, validation_s=2.0)
    assert trial_cost(hit, "time") == pytest.approx(40 * 0.05 + 2.0)  # not its slower clock
    assert trial_cost(hit, "steps") == 40 and trial_cost(hit, "samples") == 640
    assert seed_figure(hit, "steps") == (40.0, True)
    miss = race_trial(steps=40, batch=16, step_s=0.05, reached=False, value=0.45)  # 50 % short
    assert trial_value(miss, "time") == pytest.approx((40 * 0.05 + 1.0) * 1.5)
    assert seed_figure(miss, "samples") == (640.0, False)
    # a smaller batch that needs more steps loses on time, wins on samples
    small = race_trial(steps=60, batch=8, step_s=0.045, validation_s=3.0)
    assert trial_cost(small, "time") > trial_cost(hit, "time")
    assert trial_cost(small, "samples") < trial_cost(hit, "samples")


class FakeLab:
    """Speed trials: the command at 0.1 s a step, the pick at ``pick_s`` (batch 10 both)."""

    def __init__(self, pick_s: float):
        self.trials, self.pick_s = [], pick_s

    def run(self, name, overrides, settings):
        step_s = self.pick_s if "optimizer.lr=0.3" in overrides else 0.1
        trial = Trial(
            name,
            overrides,
            str(len(self.trials)),
            Path("."),
            {"status": "ok", "samples_per_s_windows": [10 / step_s]},
            1.0,
        )
        self.trials.append(trial)
        return trial


def decided(cost: str, steps: int = 30, step_s: float = 0.14, base_seeds: int = 3):
    """decide() on a pick that needs ``steps`` on every paired seed (the command: 40) at
    ``step_s`` a step (the command: 0.1)."""
    search = SimpleNamespace(
        settings=Settings(objective="time_to_target", cost=cost, min_rounds=2, max_rounds=2),
        lab=FakeLab(step_s),
        recipe=(),
        verdict="",
        speed=None,
        notes=[],
        left=lambda: 600.0,
        typical_seconds=lambda: 1.0,
        batch=lambda overrides: 10,
        seed=0,
        speed_reserve=lambda: 600.0,
        confirm_seconds=lambda: 1.0,  # no held-out run
    )
    base = [race_trial(40, 10, 0.1, validation_s=0.0) for _ in range(base_seeds)]
    pick = [race_trial(steps, 10, step_s, validation_s=0.0) for _ in range(3)]
    search.confirmed = {
        BASELINE: {"overrides": (), "trials": base},
        "optimizer.lr=0.3": {
            "overrides": ("optimizer.lr=0.3",),
            "trials": pick,
            "decision": {"verdict": BETTER},
        },
    }
    decide(search)
    return search


def test_a_pick_not_faster_in_time_keeps_the_command_and_says_why():
    kept = decided("time")
    assert kept.recipe == ()
    ratio = kept.speed.time_ratio()
    assert ratio["estimate"] == pytest.approx(0.75 * 1.4) and ratio["verdict"] == "not significant"
    assert "not lower beyond the noise, so your command is kept" in kept.verdict
    assert "1.05x" in kept.verdict
    # searched for another machine (every step costs the same): the steps decide
    adopted = decided("steps")
    assert adopted.recipe == ("optimizer.lr=0.3",)
    assert "autotune.cost=steps" in adopted.verdict and "1.05x" in adopted.verdict
    # half the steps at the same step time: faster beyond the lattice's noise, adopted
    faster = decided("time", steps=20, step_s=0.1)
    assert faster.recipe == ("optimizer.lr=0.3",) and "faster beyond the noise" in faster.verdict
    assert faster.speed.time_ratio()["high"] < 1


def test_a_kept_command_that_missed_the_target_says_how_often_and_which_recipe_reached_it():
    def kept(base_reached: list[bool]) -> str:
        base = [race_trial(40, 10, 0.1, 0.0, reached=ok) for ok in base_reached]
        steady = [race_trial(30, 10, 0.1, 0.0) for _ in range(3)]
        shaky = [race_trial(20, 10, 0.1, 0.0, reached=ok) for ok in (True, False, True)]
        search = SimpleNamespace(settings=Settings(objective="time_to_target"), recipe=())
        search.confirmed = {
            BASELINE: {"overrides": (), "trials": base},
            "optimizer.lr=0.3": {
                "overrides": ("optimizer.lr=0.3",),
                "trials": steady,
                "decision": {"verdict": NOISE, "p_adjusted": 0.049},
            },
            "optimizer.lr=0.9": {
                "overrides": ("optimizer.lr=0.9",),
                "trials": shaky,
                "decision": {"verdict": "missed the target", "p_adjusted": 1.0},
            },
        }
        decide(search)
        assert search.recipe == ()
        return search.verdict

    assert kept([True, False, False]).endswith(
        "your command is kept. Your command missed the target on 2 of its 3 paired seeds; "
        "`optimizer.lr=0.3` reached it on all 3 of its own (corrected p 0.049, above the "
        "level 0.025)"
    )
    assert kept([True, True, True]).endswith("beyond the noise; your command is kept")


def test_your_command_enters_the_study_at_its_cost_with_steps_and_samples_beside(caplog):
    import logging

    optuna = pytest.importorskip("optuna")
    from optuna.distributions import FloatDistribution

    from tuneup.autotune.time_to_target import StudySearch

    lab = SimpleNamespace(run=lambda *a, **k: race_trial(40, 16, 0.05, validation_s=2.0))
    search = StudySearch(
        Settings(objective="time_to_target"),
        lab,
        None,
        SimpleNamespace(seconds=600.0, elapsed=0.0),
        0,
        "",
    )
    search.study = optuna.create_study()
    with caplog.at_level(logging.INFO, logger="tuneup.autotune.time_to_target"):
        search.baseline_run(None)
    assert "your command: 4 s to the target (40 steps, 640 samples; autotune.cost=time)" in (
        caplog.text
    )
    lr = FloatDistribution(1e-3, 1.0, log=True)
    search.space = SimpleNamespace(
        distributions={"optimizer.lr": lr},
        params_of=lambda value_of: {"optimizer.lr": value_of("optimizer.lr")},
    )
    search.add_baseline_trial({"optimizer": {"lr": 0.1}})
    [trial] = search.study.trials
    assert trial.value == pytest.approx(40 * 0.05 + 2.0) and trial.params == {"optimizer.lr": 0.1}


def test_the_pick_is_timed_on_its_own_seeds_when_the_command_ran_more():
    """Seeds are added while a candidate is undecided and the command runs every one of them:
    the pick's 3 seeds pair with the command's first 3 of 5."""
    kept = decided("time", base_seeds=5)
    assert kept.speed.time_ratio()["seeds"] == 3


def test_a_miss_of_fast_steps_is_told_to_the_study_above_a_hit_of_slow_ones():
    """The sampler must not take a configuration that missed the target for a better one
    than a configuration that reached it (docs/autotune.md: a miss ranks above every hit)."""
    import optuna
    from optuna.distributions import FloatDistribution

    from tuneup.autotune.study.explore import tell

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study()
    lr = {"optimizer.lr": FloatDistribution(0.01, 1.0)}
    baseline = optuna.trial.create_trial(
        params={"optimizer.lr": 0.05},
        distributions=lr,
        value=trial_value(race_trial(steps=40, batch=16, step_s=0.05)),  # 3.0 s, reached
        user_attrs={"tuneup_baseline": True},
    )
    study.add_trial(baseline)
    search = SimpleNamespace(study=study, settings=SimpleNamespace(cost="time"))
    fast = race_trial(steps=20, batch=16, step_s=0.02, reached=False, value=0.855)  # 5 % short
    assert trial_value(fast) < baseline.value  # 1.4 s x 1.05: below the hit by its cost alone
    trial = study.ask(lr)
    assert tell(search, trial, fast) is False
    told = study.trials[-1]
    assert told.user_attrs["reached"] is False
    assert told.value == pytest.approx(3.0 * 1.05)  # above the hit, by its distance
    assert study.best_trial.user_attrs == {"tuneup_baseline": True}
