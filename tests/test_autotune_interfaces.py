"""The autotune's stages read what they are given through protocols (study/inputs.py,
confirm/inputs.py, report/inputs.py; docs/design.md "The autotune, stage by stage"): the
searches that run them provide every member, from the start. No training: milliseconds."""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest

from tuneup.autotune.confirm import ConfirmInputs
from tuneup.autotune.report import SpeedAnswer, StudyAnswer
from tuneup.autotune.settings import Settings
from tuneup.autotune.speed import Budget, Search
from tuneup.autotune.study import StudyBudget, StudyInputs
from tuneup.autotune.time_to_target import StudySearch


def protocol_members(protocol) -> set[str]:
    """The attributes and methods a typing.Protocol asks for, its base protocols' too."""
    found = set()
    for klass in protocol.__mro__:
        if getattr(klass, "_is_protocol", False) and klass.__module__ != "typing":
            found |= set(inspect.get_annotations(klass))
            found |= {n for n, v in vars(klass).items() if callable(v) and not n.startswith("_")}
    return found


def study_search() -> StudySearch:
    settings = Settings(objective="time_to_target", budget_minutes=10)
    now = [0.0]
    search = StudySearch(
        settings,
        SimpleNamespace(trials=[]),
        None,
        Budget(settings.budget_seconds, clock=lambda: now[0]),
        0,
        "unused",
    )
    search.baseline = {"seconds": 30.0}
    now[0] = 30.0  # the baseline has run
    return search


@pytest.mark.parametrize("protocol", [StudyBudget, StudyInputs, ConfirmInputs, StudyAnswer])
def test_the_time_to_target_search_gives_each_stage_every_input_it_asks_for(protocol):
    search = study_search()
    wanted = protocol_members(protocol)
    assert wanted, protocol.__name__
    assert sorted(n for n in wanted if not hasattr(search, n)) == []


def test_the_budget_is_read_by_its_public_names():
    search = study_search()
    search.explored = lambda: []
    assert {"left", "reserve", "confirm_seconds", "speed_reserve"} <= protocol_members(StudyBudget)
    assert search.left() == 600.0 - 30.0
    assert search.confirm_seconds() == 30.0  # a run to the target, as the baseline's


def test_the_speed_stage_gives_the_report_every_input_it_asks_for():
    search = Search(Settings(), SimpleNamespace(trials=[]), None, Budget(60.0))
    wanted = protocol_members(SpeedAnswer)
    assert {"outcomes", "confirmation", "recipe"} <= wanted
    assert sorted(n for n in wanted if not hasattr(search, n)) == []
