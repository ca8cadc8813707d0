"""A sweeper lost with its host (issue 48, points 1 and 2; tuneup/optuna/liveness.py,
tuneup/autotune/study/handover.py): its heartbeat in the study goes stale, its running trials
are failed and asked again by the sweepers left, and a sweeper that waits for a lost leader's
answer answers itself. Made-up clocks and hosts, fake launchers: under a second each."""

from __future__ import annotations

import json
import logging
import time

import pytest

from tests.test_study_workers import RaceLauncher, study_search
from tuneup.autotune.study import handover
from tuneup.autotune.study import leader as study_leader
from tuneup.optuna import liveness

optuna = pytest.importorskip("optuna")

from optuna.trial import TrialState  # noqa: E402

from tuneup.optuna.study import (  # noqa: E402
    INTERRUPTED_ATTR,
    RETRY_ATTR,
    SWEEPER_ATTR,
    recover_interrupted,
)

NOW = 1_000_000.0


def heartbeat(at: float, **more) -> dict:
    return {"at": at, "host": "elsewhere", **more}


def test_a_sweeper_on_another_host_is_gone_once_its_heartbeat_is_stale_or_ended():
    """Another host's sweeper: alive with a fresh heartbeat, gone with one older than
    STALE_S (lost) or one that says it ended (not lost: it stopped); with no heartbeat
    recorded (an older tuneup's study) it is not taken for gone."""
    stale = NOW - liveness.STALE_S - 1
    attrs = {
        "tuneup_alive:node-a:1": heartbeat(NOW - 5),
        "tuneup_alive:node-b:1": heartbeat(stale),
        "tuneup_alive:node-c:1": heartbeat(stale, ended=True),
    }
    assert not liveness.is_gone("node-a:1", attrs, NOW)
    assert liveness.is_gone("node-b:1", attrs, NOW) and liveness.lost("node-b:1", attrs, NOW)
    assert liveness.is_gone("node-c:1", attrs, NOW) and not liveness.lost("node-c:1", attrs, NOW)
    assert not liveness.is_gone("node-d:1", attrs, NOW)  # no heartbeat: left to it
    assert not liveness.is_gone("node-b:1", attrs, stale + 10)  # fresh then


def test_a_lost_hosts_running_trials_are_failed_and_asked_again_once():
    """A RUNNING trial of a sweeper whose heartbeat is stale is failed (interrupted) and its
    values asked again; a fresh sweeper's, one with no heartbeat and one with no sweeper yet
    (mid-sweep) are left; a second sweeper recovering after the first finds nothing to do
    (no second retry)."""
    study = optuna.create_study()
    space = {"x": optuna.distributions.FloatDistribution(0, 1)}
    owners = ["node-lost:1", "node-live:1", "node-old:1"]
    for owner in owners:
        study.ask(space).set_user_attr(SWEEPER_ATTR, owner)
    study.ask(space)  # just asked by another sweeper, which has not yet written its name
    study.set_user_attr("tuneup_alive:node-lost:1", heartbeat(time.time() - 1000))
    study.set_user_attr("tuneup_alive:node-live:1", heartbeat(time.time()))
    assert [t.number for t in recover_interrupted(study, keep="node-a:1")] == [0]
    assert recover_interrupted(study, keep="node-b:1") == []  # another sweeper, after it
    trials = study.get_trials()
    assert [t.state for t in trials] == [
        TrialState.FAIL,
        *[TrialState.RUNNING] * 3,
        TrialState.WAITING,
    ]
    assert trials[0].user_attrs[INTERRUPTED_ATTR] and trials[4].user_attrs[RETRY_ATTR] == 0
    assert study.ask(space).params == trials[0].params  # its values come first


def test_a_sweeper_exploring_runs_again_the_trial_of_a_sweeper_lost_meanwhile(tmp_path):
    """A sweeper on another host asked a trial and was lost (stale heartbeat) after this
    sweeper opened the study: this sweeper's explore fails that trial, runs its values
    again, and fills the budget (2 trials) with its own."""
    search = study_search(tmp_path, RaceLauncher(tmp_path / "sweep", until=0), trials=2, workers=1)
    lost = search.study.ask()
    lost.suggest_float("optimizer.lr", 0.05, 1.0, log=True)
    lost.set_user_attr(SWEEPER_ATTR, "node-lost:1")
    search.study.set_user_attr("tuneup_alive:node-lost:1", heartbeat(time.time() - 1000))
    search.explore()
    trials = search.study.get_trials()
    assert trials[0].state == TrialState.FAIL and trials[0].user_attrs[INTERRUPTED_ATTR]
    again = [t for t in trials if t.user_attrs.get(RETRY_ATTR) == 0]
    assert [t.state for t in again] == [TrialState.COMPLETE]
    assert again[0].params == trials[0].params
    counted = [t for t in trials if study_leader.counts(t)]
    assert len(counted) == 2 and all(t.state == TrialState.COMPLETE for t in counted)


class Clock:
    """A made-up wall clock: ``sleep`` moves it on, and runs ``on_sleep`` (another
    sweeper's doings) at each look."""

    def __init__(self, on_sleep=lambda now: None) -> None:
        self.now, self.on_sleep, self.sleeps = NOW, on_sleep, 0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.sleeps += 1
        self.on_sleep(self.now)


def waiting(tmp_path):
    """Sweeper node-b:1 (ticket 2) at the end of its explore; node-a:1 (ticket 0) leads,
    its heartbeat fresh, its budget ending in an hour."""
    (tmp_path / "b").mkdir(parents=True)
    search = study_search(tmp_path, RaceLauncher(tmp_path / "b"), trials=4, workers=1)
    search.sweeper, search.ticket, study = "node-b:1", 2, search.study
    study_leader.register(study, "node-b:1", 2, str(tmp_path / "b"), NOW + 3600)
    study.set_user_attr("tuneup_sweeper:node-a:1", {"ticket": 0, "host": "node-a", "sweep_dir": str(tmp_path / "a"), "deadline": NOW + 3600})  # fmt: skip
    study.set_user_attr("tuneup_alive:node-a:1", heartbeat(NOW))
    return search


def test_a_sweeper_that_gives_way_waits_for_the_answer_and_then_ends(tmp_path, caplog):
    """The leader is alive (its heartbeat kept fresh) and writes the answer after a few
    looks: the waiting sweeper gives way then, naming the leader in answered_by.json."""
    search = waiting(tmp_path)

    def leader_works(now: float) -> None:
        search.study.set_user_attr("tuneup_alive:node-a:1", heartbeat(now))
        if now >= NOW + 300:  # beyond STALE_S: a live leader is not taken for lost
            answer = {"by": "node-a:1", "host": "node-a", "sweep_dir": str(tmp_path / "a")}
            search.study.set_user_attr(study_leader.ANSWERED, {**answer, "through": 7})

    clock = Clock(leader_works)
    with caplog.at_level(logging.INFO, logger="tuneup.autotune.study.handover"):
        assert not handover.lead(search, clock, clock.sleep)
    assert clock.sleeps == 300 / handover.POLL_S
    assert (
        "sweeper node-a:1 (host node-a) leads study 'autotune': waiting for its answer"
        in caplog.text
    )
    gave_way = json.loads((tmp_path / "b" / study_leader.GAVE_WAY).read_text())
    assert gave_way["sweeper"] == "node-a:1" and gave_way["sweep_dir"] == str(tmp_path / "a")


def test_a_sweeper_that_waits_for_a_lost_leader_answers_itself(tmp_path, caplog):
    """The leader's heartbeat stops (its host lost): once it is STALE_S old the waiting
    sweeper leads (confirms and answers); no answered_by.json. A leader that lives past its
    budget's end without answering is not waited for longer than that (+ grace)."""
    search = waiting(tmp_path)
    theirs = search.study.ask()  # a third sweeper's, lost too: not waited for, asked again
    theirs.suggest_float("optimizer.lr", 0.05, 1.0, log=True)
    theirs.set_user_attr(SWEEPER_ATTR, "node-c:1")
    search.study.set_user_attr("tuneup_alive:node-c:1", heartbeat(NOW))
    clock = Clock()
    with caplog.at_level(logging.INFO, logger="tuneup.autotune.study.handover"):
        assert handover.lead(search, clock, clock.sleep)
    assert liveness.STALE_S < clock.now - NOW <= liveness.STALE_S + handover.POLL_S
    assert "sweeper node-a:1 is lost or ended: this one answers" in caplog.text
    assert search.answered_by is None and not (tmp_path / "b" / study_leader.GAVE_WAY).exists()
    trials = search.study.get_trials()
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.WAITING]
    assert trials[1].user_attrs[RETRY_ATTR] == theirs.number

    search = waiting(tmp_path / "late")
    alive = Clock(lambda now: search.study.set_user_attr("tuneup_alive:node-a:1", heartbeat(now)))
    assert not handover.lead(search, alive, alive.sleep)
    end = 3600 + liveness.STALE_S + handover.GRACE_S
    assert end < alive.now - NOW <= end + handover.POLL_S


def test_a_sweeper_taken_for_lost_drops_the_result_of_a_trial_failed_under_it(caplog):
    """Another sweeper failed this sweeper's running trial (its heartbeat was late): telling
    it is refused by the storage; the sweep goes on (a line says so) instead of crashing,
    and fills its trials with new ones."""
    from tuneup.optuna.workers import run_trials

    study = optuna.create_study()

    def launch(number: int, job):
        if number == 0:  # meanwhile another sweeper recovers it
            study.set_user_attr("tuneup_alive:node-a:1", heartbeat(0.0))
            recover_interrupted(study, keep="node-b:1")
        return number

    def tell(trial, outcome) -> bool:
        trial.set_user_attr("outcome", outcome)
        study.tell(trial, 1.0)
        return False

    def ask():
        trial = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
        trial.set_user_attr(SWEEPER_ATTR, "node-a:1")
        return trial, ["job"]

    with caplog.at_level(logging.WARNING, logger="tuneup.optuna.workers"):
        run_trials(study, workers=1, n_trials=2, ask=ask, launch=launch, tell=tell, max_failure_rate=1.0)  # fmt: skip
    assert "trial 0 was failed by another sweeper of the study while it ran" in caplog.text
    states = [t.state for t in study.get_trials()]
    assert states[0] == TrialState.FAIL and states.count(TrialState.COMPLETE) == 2
