"""The time-to-target study's default space (tuneup/autotune/study/space.py, study/family.py,
study/companions.py; issue 50 item 4): the optimizer family where it applies, each member with
its own learning-rate range, and what is left out with the plugins' own reasons. Compositions
only, nothing trained."""

from __future__ import annotations

import pytest

from tests.conftest import compose_config
from tuneup.autotune.report.study_markdown import _space_lines
from tuneup.autotune.space import Checks
from tuneup.autotune.study.space import build_space, default_params, searched
from tuneup.autotune.study.trials import config_value

optuna = pytest.importorskip("optuna")

MLP = [
    "trainer.accelerator=cpu",
    "data=digits",
    "model=mlp",
    "model.hidden=[32]",
    "data.image_size=8",
    "data.channels=1",
    "optimizer=adamw",
]


def checks(*extra: str) -> Checks:
    return Checks(lambda overrides: compose_config([*MLP, *extra, *overrides], tiny=False))


def test_the_default_space_holds_the_optimizer_family_each_with_its_own_learning_rate():
    found = checks()
    yours = found.inspect(()).config
    params = {**default_params(yours, 40), "scheduler": "choice(constant, cosine)"}  # 2: cheaper
    space = build_space(params, [], found, lambda key: key in ("optimizer", "scheduler"))
    assert space.distributions["optimizer"].choices == ("adamw", "muon", "schedulefree", "nadamw")
    ranges = {
        name.split("@")[1]: (d.low, d.high)
        for name, d in space.distributions.items()
        if name.startswith("optimizer.lr@")
    }
    assert ranges["adamw"] == pytest.approx((1e-4, 0.03))  # yours: lr / 10 to lr x 30
    assert ranges["nadamw"] == pytest.approx((1e-4, 0.03))  # Adam's scale: as yours
    assert ranges["schedulefree"] == pytest.approx((2.5e-4, 0.075))  # 2.5x (its default)
    assert ranges["muon"] == pytest.approx((0.002, 0.6))  # its own scale, around its 0.02
    # schedule-free takes no schedule: its check refuses cosine and wsd, so it runs with
    # constant and the scheduler is not sampled there
    assert space.implied == {"optimizer=schedulefree": {"scheduler": "constant"}}
    sampler = optuna.samplers.RandomSampler(seed=0)
    study = optuna.create_study(sampler=sampler)
    seen = set()
    for _ in range(40):
        trial = study.ask()
        values = space.sample(trial)
        study.tell(trial, 1.0)
        member = values["optimizer"]
        seen.add(member)
        low, high = ranges[member]
        assert low <= values["optimizer.lr"] <= high  # one learning rate, the member's
        assert sum(k.startswith("optimizer.lr") for k in trial.params) == 1
        if member == "schedulefree":
            assert values["scheduler"] == "constant" and "scheduler.warmup_steps" not in values
            assert found.inspect(
                space.overrides({k: values[k] for k in ("optimizer", "scheduler")})
            ).ok
        if member != "adamw":
            assert "optimizer.weight_decay" not in values  # your decay's range is yours
    assert seen == {"adamw", "muon", "schedulefree", "nadamw"}
    # your command enters the study as a trial of this space
    assert space.params_of(lambda key: config_value(yours, key))["optimizer.lr@adamw"] == 1e-3
    rows = {r["name"]: r for r in searched(space)}
    assert rows["optimizer.lr@muon"]["condition"] == "where optimizer=muon"
    assert rows["optimizer.lr@muon"]["distribution"] == "log-uniform [0.002, 0.6]"
    assert rows["scheduler"]["condition"] == (
        "not where optimizer=schedulefree (it runs with scheduler=constant)"
    )
    # a LightningModule's own loop: no optimizer keys (its code builds its optimizer)
    assert not any(k.startswith("optimizer") for k in default_params(yours, 40, own_loop=True))


def test_muon_under_fsdp_is_left_out_with_its_checks_reason():
    found = checks("strategy=fsdp")
    space = build_space(
        default_params(found.inspect(()).config), [], found, lambda key: key == "optimizer"
    )
    assert space.distributions["optimizer"].choices == ("adamw", "nadamw")
    assert "optimizer.lr@muon" not in space.distributions
    why = dict(space.dropped)
    assert "optimizer=muon cannot run under strategy=fsdp" in why["optimizer=muon"]
    # no scheduler in this space to run it with: schedule-free is left out, in its words
    assert (
        "scheduler=cosine cannot be used with optimizer=schedulefree"
        in why["optimizer=schedulefree"]
    )
    text = "\n".join(
        _space_lines(
            {
                "searched": searched(space),
                "left_out": [{"override": o, "reason": r} for o, r in space.dropped],
            }
        )
    )
    assert "## Left out" in text and "- `optimizer=muon`: [muon] optimizer=muon cannot" in text


def test_a_family_of_one_searches_your_learning_rate_on_every_trial():
    """Where only your optimizer applies, its range is the plain key, on every trial."""
    found = checks("strategy=fsdp")
    params = {
        "optimizer": "choice(adamw, muon)",
        "optimizer.lr@adamw": "tag(log, interval(1e-4, 0.03))",
        "optimizer.lr@muon": "tag(log, interval(0.002, 0.6))",
    }
    space = build_space(params, [], found, lambda key: key == "optimizer")
    assert list(space.distributions) == ["optimizer.lr"] and space.fixed == {"optimizer": "adamw"}


def test_a_learning_rate_on_the_command_line_replaces_every_members_range():
    found = checks()
    params = default_params(found.inspect(()).config)
    space = build_space(
        params, ["optimizer.lr=tag(log, interval(1e-3, 1))"], found, lambda k: False
    )
    assert not [name for name in space.distributions if "@" in name and "lr" in name]
    assert space.distributions["optimizer.lr"].high == 1


def test_an_optimizer_whose_package_is_missing_is_left_out_with_the_install_to_run(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "schedulefree", None)  # import schedulefree fails
    monkeypatch.delitem(sys.modules, "tuneup.plugins.schedulefree", raising=False)
    found = checks()
    params = {**default_params(found.inspect(()).config), "scheduler": "choice(constant, cosine)"}
    space = build_space(params, [], found, lambda key: key in ("optimizer", "scheduler"))
    assert space.distributions["optimizer"].choices == ("adamw", "muon", "nadamw")
    assert "optimizer.lr@schedulefree" not in space.distributions and not space.implied
    why = dict(space.dropped)["optimizer=schedulefree"]
    assert "optimizer=schedulefree needs pip install 'tuneup[schedulefree]'" in why
