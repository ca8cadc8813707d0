"""``autotune.workers`` (issue 48, point 1): the time-to-target study's explore stage keeps up
to N trials in flight on its one Optuna study, a worker asking the next trial as soon as its
own ends; each worker its share of the machine; a trial whose process is killed is failed
and asked again, and no finished trial runs twice. A fake launcher: milliseconds each."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from tuneup import TuneupError
from tuneup.autotune.settings import Settings
from tuneup.autotune.study.workers import Workers, resolve
from tuneup.autotune.time_to_target import StudySearch, study_sampler
from tuneup.autotune.trials import Lab

optuna = pytest.importorskip("optuna")


class RaceLauncher:
    """Jobs run in the calling thread and write a race run's summary.json. Job 0 is the slow
    one: it ends only once job ``until`` has started (which a batch of 2 holds back until
    job 0 ends when ``until`` is 2; which one worker starts only after job 0 ends). Job ``killed``'s process dies under it: its summary stays ``running`` and the launch
    raises, as joblib's does for a worker killed by SIGKILL. Records ("start"|"end", job)."""

    def __init__(self, sweep_dir: Path, killed: int | None = None, until: int = 2) -> None:
        self.sweep_dir, self.killed, self.until = sweep_dir, killed, until
        self.events: list[tuple[str, int]] = []
        self.lines: dict[int, list[str]] = {}
        self.changed = threading.Condition()

    def record(self, event: tuple[str, int]) -> None:
        with self.changed:
            self.events.append(event)
            self.changed.notify_all()

    def launch(self, job_overrides, initial_job_idx):
        [line], job = job_overrides, initial_job_idx
        self.lines[job] = list(line)
        self.record(("start", job))
        if job == 0:
            with self.changed:
                self.changed.wait_for(lambda: ("start", self.until) in self.events, timeout=20)
        run_dir = self.sweep_dir / str(job)
        (run_dir / ".hydra").mkdir(parents=True)  # as Hydra starts a job
        if job == self.killed:  # no summary.json: the run writes it as it ends
            self.record(("end", job))
            raise RuntimeError(
                "A worker process managed by the executor was unexpectedly terminated"
            )
        lr = float(next((o for o in line if o.startswith("optimizer.lr=")), "=0.01").split("=")[1])
        steps = max(5, round(5 / lr))  # a higher rate: fewer steps to the target
        history = [{"step": steps, "samples": steps * 10, "value": 0.9}]
        summary = {
            "status": "ok",
            "target": {"reached": True, "value": 0.9, "mode": "max"},
            "target_history": history,
            "steps_to_target": steps,
            "samples_to_target": steps * 10,
            "effective_batch_size": 10,
        }
        (run_dir / "summary.json").write_text(json.dumps(summary))
        self.record(("end", job))
        config = OmegaConf.create({"hydra": {"runtime": {"output_dir": str(run_dir)}}})
        return [SimpleNamespace(hydra_cfg=config)]


def explored(tmp_path: Path, launcher: RaceLauncher, trials: int, workers: int = 2):
    """The explore stage of a study over optimizer.lr, ``workers`` at once on 4 cores."""
    search = study_search(tmp_path, launcher, trials, workers)
    search.explore()
    return search, search.study.get_trials()


def study_search(tmp_path: Path, launcher, trials: int, workers: int, cost: str = "steps"):
    """A study over optimizer.lr, its baseline run, ``workers`` at once on 4 cores."""
    settings = Settings(
        objective="time_to_target", budget_trials=trials, cost=cost, seeds=2, max_seeds=2
    )
    lab = Lab(launcher, launcher.sweep_dir, ["data=digits"], 4)
    config = {"data": {"batch_size": 10}}
    accept = SimpleNamespace(
        inspect=lambda overrides: SimpleNamespace(ok=True, problems=(), config=config)
    )
    budget = SimpleNamespace(seconds=3600.0, elapsed=0.0)
    storage = str(tmp_path / "optuna.journal")
    search = StudySearch(settings, lab, accept, budget, 0, storage)
    search.use_workers(Workers(workers, False, 4))
    search.user_config = {"optimizer": {"lr": 0.01}}
    search.baseline = {"trial_samples": 1000, "samples_to_target": 500, "seconds": 1.0}
    search.space = SimpleNamespace(
        sample=lambda t: {"optimizer.lr": t.suggest_float("optimizer.lr", 0.05, 1.0, log=True)},
        overrides=lambda values: tuple(f"{k}={v}" for k, v in values.items()),
    )
    search.open_study()
    return search


def test_two_workers_keep_two_trials_in_flight_without_a_batch_barrier(tmp_path):
    """Job 1 ends while job 0 runs: job 2 starts then, before job 0 ends. The study ends with
    budget_trials finished trials, each its own job and folder; each job has its worker's
    share of the cores (4 cores / 2 workers: 2 threads) and the trial says so."""
    launcher = RaceLauncher(tmp_path / "sweep")
    search, trials = explored(tmp_path, launcher, trials=4)
    events = launcher.events
    assert events.index(("end", 1)) < events.index(("start", 2)) < events.index(("end", 0))
    assert [t.state.name for t in trials] == ["COMPLETE"] * 4
    assert sorted(t.user_attrs["tuneup_job"] for t in trials) == ["0", "1", "2", "3"]
    assert trials[2].datetime_start < trials[0].datetime_complete  # in the storage too
    for trial in trials:
        line = launcher.lines[int(trial.user_attrs["tuneup_job"])]
        assert "++hydra.job.env_set.OMP_NUM_THREADS=2" in line
        assert f"optimizer.lr={trial.params['optimizer.lr']}" in line
        assert trial.user_attrs["tuneup_worker"] == "2 thread(s)"
    assert search.study.sampler._constant_liar  # workers asking at once: lies for the running
    from tuneup.autotune.report.record import trial_dict

    assert {trial_dict(t)["worker"] for t in search.lab.trials} == {"2 thread(s)"}  # autotune.json


def test_a_killed_trial_is_failed_and_asked_again_and_no_finished_trial_runs_twice(tmp_path):
    """Job 1's process is killed (no summary.json, the launch raises): its trial
    is FAIL and marked interrupted, its values asked again (a retry that completes); the other
    worker's trial finishes; 3 trials count, 4 jobs ran, no complete trial's job twice."""
    launcher = RaceLauncher(tmp_path / "sweep", killed=1)
    _, trials = explored(tmp_path, launcher, trials=3)
    states = [t.state.name for t in trials]
    assert states == ["COMPLETE", "FAIL", "COMPLETE", "COMPLETE"]
    killed = trials[1]
    assert killed.user_attrs["tuneup_interrupted"] and "killed" in killed.user_attrs["error"]
    [retry] = [t for t in trials if t.user_attrs.get("tuneup_retry_of") == killed.number]
    assert retry.state.name == "COMPLETE" and retry.params == killed.params
    jobs = [t.user_attrs["tuneup_job"] for t in trials if t.state.name == "COMPLETE"]
    assert len(jobs) == len(set(jobs)) == 3 and "1" not in jobs
    assert sorted(launcher.lines) == [0, 1, 2, 3]  # 3 counted trials and the killed one
    assert not (tmp_path / "sweep" / "1" / "summary.json").exists()


def test_a_launcher_error_before_the_job_starts_is_raised_not_retried(tmp_path):
    """No job folder: the launcher's own error (not a killed run) stops the study, as before."""

    class Broken(RaceLauncher):
        def launch(self, job_overrides, initial_job_idx):
            raise RuntimeError("cannot submit")

    with pytest.raises(RuntimeError, match="cannot submit"):
        explored(tmp_path, Broken(tmp_path / "sweep"), trials=2)


def test_the_confirmations_seeds_run_two_at_a_time(tmp_path):
    """autotune.workers=2, 2 paired seeds: your command's two seeds run at once (job 1 starts
    while job 0 runs), then the candidate's two, with the sample limit your command's runs
    set; each configuration's runs kept in seed order, each with its worker's threads."""
    from tuneup.autotune.confirm.seeds import confirm
    from tuneup.autotune.trials import BASELINE

    launcher = RaceLauncher(tmp_path / "sweep", until=1)
    search = study_search(tmp_path, launcher, trials=1, workers=2)
    lr = optuna.distributions.FloatDistribution(0.05, 1.0, log=True)
    attrs = {"reached": True, "tuneup_overrides": ["optimizer.lr=0.5"]}
    found = optuna.trial.create_trial(
        params={"optimizer.lr": 0.5},
        distributions={"optimizer.lr": lr},
        value=10.0,
        user_attrs=attrs,
    )
    search.study.add_trial(found)
    confirm(search)
    events = launcher.events
    assert events.index(("start", 1)) < events.index(("end", 0))  # two at once
    assert max(events.index(("end", 0)), events.index(("end", 1))) < events.index(("start", 2))
    assert sorted(launcher.lines) == [0, 1, 2, 3]
    for name, seeds in (
        (BASELINE, ["seed=1", "seed=2"]),
        ("optimizer.lr=0.5", ["seed=1", "seed=2"]),
    ):
        trials = search.confirmed[name]["trials"]
        assert [t.overrides[-1] for t in trials] == seeds
        assert all(t.worker == "2 thread(s)" for t in trials)
    limit = search.confirmed["optimizer.lr=0.5"]["samples_budget"]
    assert limit == 7500  # your command's 5,000 samples to target on them x race_margin 1.5
    for job in (2, 3):
        assert f"target.max_samples={limit}" in launcher.lines[job]
        assert "++hydra.job.env_set.OMP_NUM_THREADS=2" in launcher.lines[job]


class SpeedLauncher:
    """Throughput trials: samples/s by the learning rate in the line (none: your command's)."""

    def __init__(self, sweep_dir: Path, speeds: dict[str, float]) -> None:
        self.sweep_dir, self.speeds, self.lines = sweep_dir, speeds, []

    def launch(self, job_overrides, initial_job_idx):
        [line] = job_overrides
        self.lines.append(list(line))
        lr = next((o for o in line if o.startswith("optimizer.lr=")), "")
        run_dir = self.sweep_dir / str(initial_job_idx)
        (run_dir / ".hydra").mkdir(parents=True)
        summary = {"status": "ok", "samples_per_s_windows": [self.speeds[lr]]}
        (run_dir / "summary.json").write_text(json.dumps(summary))
        config = OmegaConf.create({"hydra": {"runtime": {"output_dir": str(run_dir)}}})
        return [SimpleNamespace(hydra_cfg=config)]


def shared_cores(tmp_path: Path, speeds: dict[str, float]):
    """2 workers on a CPU, autotune.cost=time, autotune.confirm=1; two trials that reached
    the target: A (lr 0.5, 10 steps, its own time 1 s), B (lr 0.2, 12 steps, 6 s)."""
    launcher = SpeedLauncher(tmp_path / "sweep", speeds)
    search = study_search(tmp_path, launcher, trials=2, workers=2, cost="time")
    search.settings = Settings(**{**search.settings.__dict__, "confirm": 1})
    lr = optuna.distributions.FloatDistribution(0.05, 1.0, log=True)
    for value, steps, own in ((0.5, 10, 1.0), (0.2, 12, 6.0)):
        attrs = {
            "reached": True,
            "tuneup_overrides": [f"optimizer.lr={value}"],
            "steps": steps,
            "validation_s": 0.5,
        }
        search.study.add_trial(
            optuna.trial.create_trial(
                params={"optimizer.lr": value},
                distributions={"optimizer.lr": lr},
                value=own,
                user_attrs=attrs,
            )
        )
    return search, launcher


def test_on_shared_cores_time_ranks_by_seconds_per_step_timed_one_at_a_time(tmp_path):
    """autotune.workers=2 on a CPU, autotune.cost=time: trial A (10 steps) looked fast beside
    the other worker (its own windows: 0.1 s a step) and B (12 steps) slow; timed one at a
    time, interleaved (your command, A, B; then B, A, your command), A takes 1 s a step and
    B 0.1 s: B is the one confirmed, and the note says which rule applied."""
    from tuneup.autotune.confirm.seeds import _best

    speeds = {"": 100.0, "optimizer.lr=0.5": 10.0, "optimizer.lr=0.2": 100.0}  # samples/s
    search, launcher = shared_cores(tmp_path, speeds)
    [(name, overrides, number)] = _best(search)
    assert name == "optimizer.lr=0.2" and overrides == (name,) and number == 1
    order = [
        next((o for o in line if o.startswith("optimizer.lr=")), "") for line in launcher.lines
    ]
    first = ["", "optimizer.lr=0.5", "optimizer.lr=0.2"]
    assert order == [*first, *first[::-1]]  # interleaved, the order reversed every round
    for line in launcher.lines:  # one at a time, each with all 4 cores
        assert "++hydra.job.env_set.OMP_NUM_THREADS=4" in line
    assert search.step_cost == {
        (): pytest.approx(0.1),
        ("optimizer.lr=0.5",): pytest.approx(1.0),
        ("optimizer.lr=0.2",): pytest.approx(0.1),
    }
    assert "shared the cores: the candidates' and your command's seconds per step were timed" in (
        " ".join(search.notes)
    )


def test_without_your_commands_speed_timed_apart_the_trials_own_times_rank(tmp_path):
    from tuneup.autotune.confirm.seeds import _best

    speeds = {"": 0.0, "optimizer.lr=0.5": 10.0, "optimizer.lr=0.2": 100.0}  # "": no window
    search, _ = shared_cores(tmp_path, speeds)
    assert [name for name, _, _ in _best(search)] == ["optimizer.lr=0.5"]  # its own 1 s
    assert search.step_cost == {}
    assert "no seconds per step could be timed apart: each run's own were used" in search.notes[-1]


def test_one_worker_is_the_serial_study_and_tpe_does_not_lie():
    assert not study_sampler(Settings(), 0, 1)._constant_liar
    assert study_sampler(Settings(), 0, 2)._constant_liar


def test_workers_the_launcher_cannot_run_at_once_are_one_line_before_any_trial():
    from hydra._internal.core_plugins.basic_launcher import BasicLauncher
    from hydra_plugins.hydra_joblib_launcher.joblib_launcher import JoblibLauncher

    cpu = OmegaConf.create({"trainer": {"accelerator": "cpu", "devices": 1}})
    assert resolve(None, BasicLauncher(), cpu).count == 1  # a CPU: one unless given
    with pytest.raises(TuneupError) as error:
        resolve(2, BasicLauncher(), cpu)
    assert str(error.value) == (
        "autotune.workers=2 needs 2 jobs at once, but the basic launcher runs its jobs in this "
        "process, one at a time; run them in processes of their own: hydra/launcher=joblib "
        "hydra.launcher.n_jobs=2"
    )
    assert resolve(2, JoblibLauncher(n_jobs=2), cpu).count == 2
    with pytest.raises(TuneupError, match=r"hydra\.launcher\.n_jobs=3"):
        resolve(3, JoblibLauncher(n_jobs=2), cpu)
    with pytest.raises(TuneupError) as error:
        Settings(workers=0).check()
    assert "autotune.workers=0 is not allowed: expected null" in str(error.value)


def test_each_worker_has_its_share_of_the_machine():
    assert Workers(1, False, 8).resources(0) == ([], "")  # one: the machine as it is
    assert Workers(3, False, 8).resources(2) == (
        ["++hydra.job.env_set.OMP_NUM_THREADS=2"],
        "2 thread(s)",
    )
    assert Workers(2, True, 8).resources(1) == (["trainer.devices=[1]"], "GPU 1")


def test_a_gpu_workers_device_is_an_index_a_reused_process_honours():
    """A joblib worker process keeps CUDA as its first job set it up, so a later job's
    CUDA_VISIBLE_DEVICES would be ignored; the device index is the run's own setting: the
    job composes to one process on GPU 1."""
    from tests.conftest import compose_config
    from tuneup.trainer.environment import Environment

    overrides, _ = Workers(2, True, 8).resources(1)
    cfg = compose_config(["trainer.accelerator=gpu", *overrides])
    assert list(cfg.trainer.devices) == [1]
    env = Environment.from_config(cfg)
    assert env.is_cuda and env.world_size == 1


def test_on_a_gpu_machine_the_default_is_one_worker_per_gpu(monkeypatch):
    """A one-device command on 4 GPUs: 4 workers, each its own device; the basic launcher
    runs one job at a time: 1; more workers than GPUs: one line."""
    from hydra._internal.core_plugins.basic_launcher import BasicLauncher

    from tuneup.autotune.study import workers as study_workers

    monkeypatch.setattr(study_workers, "_gpus", lambda: 4)
    gpu = OmegaConf.create({"trainer": {"accelerator": "gpu", "devices": 1}})
    found = resolve(None, object(), gpu)  # submitit's and others: as many as asked
    assert (found.count, found.cuda, found.shared_cores) == (4, True, False)
    assert resolve(None, BasicLauncher(), gpu).count == 1
    with pytest.raises(TuneupError) as error:
        resolve(8, object(), gpu)
    assert str(error.value) == (
        "autotune.workers=8: each worker has a GPU of its own and this machine shows 4; give "
        "at most autotune.workers=4"
    )
