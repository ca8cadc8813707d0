"""Two sweepers on one study (issue 48, point 2; tuneup/autotune/study/leader.py): they share
one ``autotune.budget_trials``, and exactly one of them writes the answer, the others naming
it. Fake launchers and in-memory or journal studies: milliseconds each."""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time

import pytest

from tests.test_study_workers import RaceLauncher, study_search
from tuneup.autotune.study import handover
from tuneup.autotune.study import leader as study_leader

optuna = pytest.importorskip("optuna")

from optuna.trial import TrialState  # noqa: E402

from tuneup.optuna.study import INTERRUPTED_ATTR, SWEEPER_ATTR  # noqa: E402


class MeetingLauncher(RaceLauncher):
    """A race run that ends only once both sweepers have a job started (``met``), so that the
    two sweepers' trials overlap whatever order their threads start in."""

    def __init__(self, sweep_dir, met: threading.Barrier) -> None:
        super().__init__(sweep_dir, until=0)  # RaceLauncher's job 0 waits for nothing
        self.met = met

    def launch(self, job_overrides, initial_job_idx):
        if not self.met.broken:
            with contextlib.suppress(threading.BrokenBarrierError):
                self.met.wait(timeout=20)
        return super().launch(job_overrides, initial_job_idx)


def sweeper(tmp_path, name: str, met: threading.Barrier):
    """A sweeper on the study in ``tmp_path/optuna.journal``, on host ``name`` (another host:
    never taken for gone), its sweep directory ``tmp_path/name``."""
    search = study_search(tmp_path, MeetingLauncher(tmp_path / name, met), trials=4, workers=1)
    search.sweeper = f"{name}:1"
    return search


def test_two_sweepers_share_one_budget_and_exactly_one_answers(tmp_path, caplog):
    """Two sweepers explore one study at once with budget_trials=4: the study has 4 counted
    trials, from both, with no parameters repeated; the sweeper of the lowest first trial
    leads, the other gives way with a line naming the leader's host and sweep directory."""
    met = threading.Barrier(2)
    one, two = sweeper(tmp_path, "node-a", met), sweeper(tmp_path, "node-b", met)
    threads = [threading.Thread(target=s.explore) for s in (one, two)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    trials = one.study.get_trials()
    counted = [t for t in trials if study_leader.counts(t)]
    assert len(counted) == 4 and all(t.state == TrialState.COMPLETE for t in counted)
    assert {t.user_attrs[SWEEPER_ATTR] for t in counted} == {"node-a:1", "node-b:1"}
    params = [t.params["optimizer.lr"] for t in counted]
    assert len(set(params)) == 4  # no parameters repeat
    first, second = sorted((one, two), key=lambda s: s.ticket)
    with caplog.at_level(logging.INFO, logger="tuneup.autotune.study.handover"):
        assert handover.lead(first)
        study_leader.answered(first.study, first.sweeper, str(first.lab.sweep_dir))
        assert not handover.lead(second)  # the answer covers its trials: it gives way
    assert second.answered_by["sweeper"] == first.sweeper and first.answered_by is None
    assert (
        f"sweeper {first.sweeper} (host {second.answered_by['host']}) "
        f"writes the answer of study 'autotune' into {first.lab.sweep_dir}" in caplog.text
    )
    gave_way = json.loads((second.lab.sweep_dir / "answered_by.json").read_text())
    assert gave_way["sweeper"] == first.sweeper and gave_way["study"] == "autotune"
    assert not (first.lab.sweep_dir / "answered_by.json").exists()


def test_a_sweeper_that_gave_way_without_a_run_ends_with_rc_0(tmp_path):
    """The sweep report of a sweeper that ran no job: none, and no exit 1 when it gave way
    (answered_by.json); an empty sweep otherwise still fails."""
    from omegaconf import OmegaConf

    from tuneup.report.callback import SweepReport

    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}})
    with pytest.raises(SystemExit):
        SweepReport().on_multirun_end(config)
    (tmp_path / "answered_by.json").write_text("{}")
    SweepReport().on_multirun_end(config)


def test_a_trial_asked_past_the_budget_counts_nowhere_and_stops_the_asking(tmp_path):
    """Another sweeper holds the study's 2 places (2 running trials): this sweeper asks no
    trial. Two trials asked at once for the last place: the later number is past the budget,
    told failed and interrupted; a killed trial below it frees its place."""
    search = study_search(tmp_path, RaceLauncher(tmp_path / "sweep"), trials=2, workers=1)
    for _ in range(2):
        search.study.ask().set_user_attr(SWEEPER_ATTR, "node-b:1")
    from tuneup.autotune.study.explore import ask

    assert ask(search) is None and "has its 2 trial(s)" in search.notes[-1]
    assert len(search.study.get_trials()) == 2  # nothing asked

    study = optuna.create_study()
    asked = [study.ask() for _ in range(3)]
    assert not study_leader.over_budget(study, 1, 2)
    assert study_leader.over_budget(study, 2, 2)
    study_leader.refuse(study, asked[2])
    refused = study.get_trials()[2]
    assert refused.state == TrialState.FAIL and refused.user_attrs[INTERRUPTED_ATTR]
    assert not study_leader.counts(refused)
    asked[0].set_user_attr(INTERRUPTED_ATTR, True)
    study.tell(asked[0], state=TrialState.FAIL)  # killed: its retry takes the place
    assert not study_leader.over_budget(study, 2, 2)


def test_the_leader_is_the_lowest_ticket_of_the_round_alive():
    """The lowest first trial leads; a sweeper gone or ended with an error does not; one whose
    trials an answer covers gives way to that answer; one with no trial leads only alone."""
    entry = lambda ticket, **more: {"ticket": ticket, "host": "h", "sweep_dir": "d", **more}  # noqa: E731
    attrs = {"tuneup_sweeper:a:1": entry(3), "tuneup_sweeper:b:2": entry(5)}
    never = lambda key: False  # noqa: E731
    assert study_leader.leader(attrs, "b:2", 5, never)[0] == "a:1"
    assert study_leader.leader(attrs, "a:1", 3, never)[0] == "a:1"
    assert study_leader.leader(attrs, "b:2", 5, lambda key: key == "a:1")[0] == "b:2"
    ended = {**attrs, "tuneup_sweeper:a:1": entry(3, ended=True)}
    assert study_leader.leader(ended, "b:2", 5, never)[0] == "b:2"
    assert study_leader.leader(attrs, "c:3", None, never)[0] == "a:1"  # asked no trial
    answered = {**attrs, "tuneup_answered": {"by": "a:1", "through": 9}}
    assert study_leader.leader(answered, "b:2", 5, never)[0] == "a:1"  # covered already
    assert study_leader.leader(answered, "c:3", None, never)[0] == "a:1"  # the answer is written
    later = {**answered, "tuneup_sweeper:d:4": entry(12)}  # a new round, on a larger budget
    assert study_leader.leader(later, "c:3", None, never)[0] == "d:4"
    assert study_leader.leader(later, "d:4", 12, never)[0] == "d:4"
    assert study_leader.leader(attrs, "c:3", None, lambda key: True)[0] == "c:3"  # all gone


def test_the_leader_waits_for_the_other_sweepers_trials_within_a_bound():
    """The leader waits until another sweeper's running trial is told; one that never ends is
    given up after the bound and named."""
    study = optuna.create_study()
    theirs = study.ask()
    theirs.set_user_attr(SWEEPER_ATTR, "node-b:1")
    mine = study.ask()
    mine.set_user_attr(SWEEPER_ATTR, "node-a:1")  # running, but its own: not waited for

    def finish_theirs():
        time.sleep(0.2)
        study.tell(theirs, 1.0)

    threading.Thread(target=finish_theirs).start()
    assert study_leader.wait_for_others(study, "node-a:1", bound_s=30, poll_s=0.01) == []
    assert study.get_trials()[theirs.number].state == TrialState.COMPLETE
    stuck = study.ask()
    stuck.set_user_attr(SWEEPER_ATTR, "node-b:1")
    # left RUNNING by a sweeper not of this round (lost on another host): not waited for
    assert study_leader.wait_for_others(study, "node-a:1", bound_s=30, among={"node-c:1"}) == []
    assert study_leader.wait_for_others(study, "node-a:1", bound_s=0.05, poll_s=0.01) == [
        stuck.number
    ]


def test_under_slurm_each_worker_is_a_job_with_its_own_allocation(monkeypatch):
    """hydra/launcher=slurm: the jobs run where Slurm places them, each with the devices and
    cores its allocation has, so no worker's job is given a device or a thread count of the
    sweeper's machine (a login node with no GPU, or another node's cores)."""
    from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher
    from omegaconf import OmegaConf

    from tuneup.autotune.study import workers as study_workers

    monkeypatch.setattr(study_workers, "_gpus", lambda: 0)  # the sweeper's node has none
    gpu = OmegaConf.create({"trainer": {"accelerator": "gpu", "devices": 1}})
    workers = study_workers.resolve(4, object.__new__(SlurmLauncher), gpu)
    assert (workers.count, workers.allocated, workers.shared_cores) == (4, True, False)
    assert workers.resources(3) == ([], "") and workers.alone() == ([], "")
    cpu = OmegaConf.create({"trainer": {"accelerator": "cpu", "devices": 1}})
    assert study_workers.resolve(2, object.__new__(SlurmLauncher), cpu).resources(1) == ([], "")
