"""One candidate per distinct configuration (tuneup/autotune/confirm/distinct.py, issue 50
points 3 and 5): the confirmation does not spend its seeds and Holm's correction on one
recipe at nearly the same values. Made-up Optuna trials: milliseconds."""

from __future__ import annotations

import pytest

from tuneup.autotune.confirm.seeds import _distinct

optuna = pytest.importorskip("optuna")
FloatDistribution = optuna.distributions.FloatDistribution
CategoricalDistribution = optuna.distributions.CategoricalDistribution

SPACE = {
    "optimizer": CategoricalDistribution(["adamw", "muon"]),
    "optimizer.lr@adamw": FloatDistribution(1e-4, 1.0, log=True),
    "optimizer.lr@muon": FloatDistribution(1e-3, 1.0, log=True),
    "data.batch_size": CategoricalDistribution([16, 32, 64, 128]),
    "ema.decay": FloatDistribution(0.9, 0.999),
}


def trial(number: int, value: float, **params):
    """A finished study trial that reached the target: ``params`` by Optuna name."""
    names = {k.replace("__", "."): v for k, v in params.items()}
    names = {k.replace(".lr_", ".lr@"): v for k, v in names.items()}
    overrides = [f"{k.split('@')[0]}={v}" for k, v in names.items()]
    made = optuna.trial.create_trial(
        params=names,
        distributions={k: SPACE[k] for k in names},
        value=value,
        user_attrs={"reached": True, "tuneup_overrides": overrides},
    )
    made.number = number
    return made


def muon(number: int, value: float, lr: float, batch: int = 128):
    return trial(number, value, optimizer="muon", optimizer__lr_muon=lr, data__batch_size=batch)


def numbers(trials, most=3, notes=None):
    return [number for _, _, number in _distinct(trials, most, notes)]


def test_the_same_recipe_at_nearly_the_same_learning_rate_is_one_candidate():
    """Muon at lr 0.45, 0.50 and 0.53 (batch 128): one configuration, its best trial stands
    for it, and the next distinct one (AdamW) gets the second place; autotune.md's note
    names the trials merged."""
    notes: list[str] = []
    trials = [muon(7, 0.067, 0.50), muon(12, 0.070, 0.45), muon(40, 0.075, 0.53)]
    adamw = trial(3, 0.2, optimizer="adamw", optimizer__lr_adamw=0.01, data__batch_size=128)
    assert numbers([*trials, adamw], notes=notes) == [7, 3]
    [note] = notes
    assert "trial 7) stands for trial(s) 12, 40" in note and "x1.5" in note


def test_another_optimizer_family_or_batch_size_is_another_candidate():
    adamw = trial(2, 0.08, optimizer="adamw", optimizer__lr_adamw=0.5, data__batch_size=128)
    assert numbers([muon(1, 0.07, 0.5), adamw]) == [1, 2]
    assert numbers([muon(1, 0.07, 0.5), muon(2, 0.08, 0.5, batch=64)]) == [1, 2]


def test_learning_rates_a_decade_apart_are_two_candidates():
    assert numbers([muon(1, 0.07, 0.01), muon(2, 0.08, 0.1)]) == [1, 2]
    assert numbers([muon(1, 0.07, 0.1), muon(2, 0.08, 0.16)]) == [1, 2]  # x1.6
    assert numbers([muon(1, 0.07, 0.1), muon(2, 0.08, 0.14)]) == [1]  # x1.4


def test_a_linear_value_is_the_same_within_a_tenth_of_its_range():
    def ema(number, decay):
        return trial(number, 0.1 * number, optimizer="muon", ema__decay=decay)

    assert numbers([ema(1, 0.95), ema(2, 0.959)]) == [1]  # 0.009 < 0.0999
    assert numbers([ema(1, 0.95), ema(2, 0.99)]) == [1, 2]


def test_closeness_is_to_the_groups_best_so_a_chain_does_not_merge_far_values():
    """0.30, 0.42, 0.59: each within x1.5 of the one before, 0.59 not of the best's 0.30."""
    trials = [muon(1, 0.07, 0.30), muon(2, 0.08, 0.42), muon(3, 0.09, 0.59)]
    assert numbers(trials) == [1, 3]


def test_the_most_candidates_are_distinct_configurations():
    trials = [muon(n, 0.06 + n / 100, 0.5 + n / 100) for n in range(5)]
    trials.append(trial(9, 0.3, optimizer="adamw", optimizer__lr_adamw=0.01))
    assert numbers(trials, most=2) == [0, 9]
