"""autotune.md's reason for a candidate never launched while most of the budget was left:
its first trial's expected time (compile: a minute at least), not a bare "ran out"."""

from __future__ import annotations

from tests.test_autotune import FakeChecks, FakeLab
from tuneup.autotune.settings import Settings
from tuneup.autotune.speed.search import Budget, Search


def test_a_first_compile_longer_than_what_is_left_says_so():
    space = {"compile": [("compile=on",)]}
    settings = Settings(dimensions=("compile",), space=space, min_rounds=2, max_rounds=2)
    found = Search(
        settings, FakeLab(lambda o, job: 100.0), FakeChecks(), Budget(30, clock=lambda: 0.0)
    ).run()
    [outcome] = [o for o in found.outcomes if o.label == "compile=on"]
    assert (outcome.verdict, outcome.reason) == (
        "not tried",
        "the budget ran out before its first round: its first trial was expected to take 60 s "
        "(a first compile is planned at a minute at least), more than the 29 s left for it",
    )
    assert [t.label for t in found.lab.trials] == ["baseline"]


def test_a_candidate_that_does_not_compose_names_the_options_that_have_its_key():
    from tests.conftest import compose_config
    from tuneup.autotune.space import Checks

    refused = Checks(compose_config).inspect(("optimizer=sgd", "optimizer.fused=true"))
    assert refused.problems == (
        "does not compose: optimizer.fused is not a setting of optimizer=sgd (its settings are: "
        "clip_grad_norm, lr, momentum, nesterov, weight_decay); it is one of optimizer=lamb, "
        "optimizer=lars",
    )
