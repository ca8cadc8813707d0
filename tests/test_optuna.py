"""tuneup's Optuna sweeper (hparams_search=optuna): the search space, pruning, several
objectives, and a study continued from its storage. The preset's default search is in
tests/test_sweep_presets.py."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests.conftest import ROOT, python
from tests.report_tables import png_size, read_table, run_name
from tests.test_sweeps import sweep

optuna = pytest.importorskip("optuna")

pytestmark = pytest.mark.slow

#: 128 samples in batches of 32: 4 optimizer steps, validated at steps 2 and 4.
SHORT = [
    "hparams_search=optuna",
    "data.train_samples=128",
    "data.val_samples=32",
    "data.batch_size=32",
    "data.image_size=8",
    "model.width=4",
    "trainer.max_epochs=1",
    "+trainer.val_check_interval=2",
    "trainer.enable_progress_bar=false",
    "hydra/sweeper/sampler=random",
    "hydra.sweeper.params=null",  # the preset's space left out: each test gives its own
]


def summary(run_dir) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def ok(done) -> None:
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def test_the_search_space_is_hydras_sweep_syntax():
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    from tuneup import TuneupError
    from tuneup.optuna.space import parse_space

    space = parse_space(
        {"optimizer.lr": "tag(log, interval(1e-4, 0.5))", "data.batch_size": "choice(32, 64)"},
        [
            "model.width=range(4, 12, 4)",
            "optimizer.name=choice(sgd,adamw)",
            "seed=3",
            "data.batch_size=16",
        ],  # the command line wins over the file
    )
    assert space.distributions == {
        "optimizer.lr": FloatDistribution(1e-4, 0.5, log=True),
        "model.width": IntDistribution(4, 8, step=4),  # range(): the stop left out, as Python's
        "optimizer.name": CategoricalDistribution(["sgd", "adamw"]),
    }
    assert space.fixed == {"seed": "3", "data.batch_size": "16"}
    assert space.overrides({"optimizer.lr": 0.01, "optimizer.name": "1e-3"}) == [
        "optimizer.lr=0.01",
        "optimizer.name='1e-3'",
        "seed=3",
        "data.batch_size=16",
    ]  # a string that would read back as a number stays a string
    assert parse_space({}, ["model.width=range(4, 12, 4)"]).grid() == {"model.width": [4, 8]}
    with pytest.raises(TuneupError, match=r"grid sampler takes choice\(\) and range\(\)"):
        space.grid()
    with pytest.raises(TuneupError, match=r"cannot sample this sweep; use choice"):
        parse_space({}, ["optimizer.lr=glob(*)"])


@pytest.mark.parametrize(
    ("sweep", "message"),
    [
        ("model.lr=tag(log, interval(0.3, 1e-4))", "the interval is empty: its low end 0.3 is "
         "above its high end 0.0001; give the low end first: tag(log, interval(0.0001, 0.3))"),
        ("model.lr=tag(log, interval(0, 1))", "a log scale needs a low end above 0, not 0"),
        ("model.width=range(4, 12, 0)", "a range's step must be above 0, not 0"),
        ("model.width=range(12, 4, -4)", "a range's step must be above 0, not -4"),
        ("model.width=range(12, 4)", "the range is empty: start 12 is not below stop 4"),
        ("model.width=shuffle(range(3, 1))", "the range is empty: start 3 is not below stop 1"),
        ("model.width=choice()", "empty choice is not legal; expected a value, choice(a, b"),
    ],
)  # fmt: skip
def test_a_sweep_optuna_cannot_sample_is_one_line_when_the_space_is_parsed(sweep, message):
    """Refused before any trial or baseline runs (both sweepers parse the space first), in one
    line naming the key and the sweep: not Optuna's ValueError when a trial samples it."""
    from tuneup import TuneupError
    from tuneup.optuna.space import parse_space

    for params, arguments in (({}, [sweep]), (dict([sweep.split("=", 1)]), [])):  # both places
        with pytest.raises(TuneupError) as caught:
            parse_space(params, arguments)
        text = str(caught.value)
        assert text.startswith(f"{sweep}: ") and message in text and "\n" not in text


def test_a_killed_sweeps_running_trial_is_failed_and_asked_again(tmp_path):
    from tuneup import TuneupError
    from tuneup.optuna import study as studies
    from tuneup.optuna.space import Space
    from tuneup.optuna.sweeper import ask

    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    storage = studies.open_storage(url)
    study = studies.create_study(storage, "s", None, None, ["maximize"])
    space = {"x": optuna.distributions.FloatDistribution(0, 1)}
    done = study.ask(space)
    study.tell(done, 1.0)
    killed = study.ask(space)
    killed.set_user_attr(studies.SWEEPER_ATTR, f"{os.uname().nodename}:{dead_pid()}")
    alive = study.ask(space)
    alive.set_user_attr(studies.SWEEPER_ATTR, f"{os.uname().nodename}:{os.getppid()}")

    again = studies.create_study(studies.open_storage(url), "s", None, None, ["maximize"])
    assert [t.number for t in studies.recover_interrupted(again, storage)] == [killed.number]
    states = [t.state.name for t in again.trials]
    assert states == [
        "COMPLETE",
        "FAIL",
        "RUNNING",
        "WAITING",
    ]  # a live sweeper's trial: left to it
    assert [t.number for t in studies.finished(again)] == [done.number]  # the killed one: not
    assert again.ask(space).params == killed.params  # its values come first
    with pytest.raises(TuneupError, match=r"hydra\.sweeper\.direction: \[.minimize.\], but"):
        studies.create_study(storage, "s", None, None, ["minimize"])
    other_kind = Space({"x": optuna.distributions.CategoricalDistribution([0, 1])})
    with pytest.raises(TuneupError, match="does not fit the stored study 's'"):
        ask(again, other_kind)  # one line, not Optuna's traceback


def test_a_continued_study_is_sampled_from_a_seed_of_its_own():
    """The sampler made again from its node with a seed from the seed and the stored trials:
    its draws are not the first process's; a new study keeps the seed; QMC keeps its own."""
    from tuneup.optuna.resume import continued_sampler, derived_seed

    node = OmegaConf.create({"_target_": "optuna.samplers.RandomSampler", "seed": 0})
    first = optuna.samplers.RandomSampler(seed=0)
    assert continued_sampler(node, first, 0) is first and derived_seed(0, 0) == 0
    space = {"x": optuna.distributions.FloatDistribution(0, 1)}

    def draws(sampler) -> list[float]:
        study = optuna.create_study(sampler=sampler)
        return [study.ask(space).params["x"] for _ in range(3)]

    again = continued_sampler(node, first, 3)
    assert draws(again) == draws(continued_sampler(node, first, 3))  # the same command: the same
    assert not set(draws(again)) & set(draws(optuna.samplers.RandomSampler(seed=0)))
    grid = OmegaConf.create(
        {"_target_": "optuna.samplers.GridSampler", "_partial_": True, "seed": 0}
    )
    made = functools.partial(optuna.samplers.GridSampler, seed=0)  # as Hydra makes it
    assert continued_sampler(grid, made, 3) is made  # its grid ids: places in its seed's shuffle
    qmc = optuna.samplers.QMCSampler(seed=0)
    assert continued_sampler(OmegaConf.create({"seed": 0}), qmc, 3) is qmc  # counts its draws


class SlowFirstLauncher:
    """A launcher whose jobs run in the calling thread and write a summary.json: trial 0's job is
    the slow one, which ends only once the event ``until`` has happened (or after ``wait_s``);
    trial 1 ends at once with the status ``second``. Records ("start"|"end", job number) in
    order."""

    def __init__(self, sweep_dir: Path, until: tuple[str, int], second: str) -> None:
        import threading

        self.sweep_dir, self.until, self.second = sweep_dir, until, second
        self.events: list[tuple[str, int]] = []
        self.changed = threading.Condition()

    def record(self, event: tuple[str, int]) -> None:
        with self.changed:
            self.events.append(event)
            self.changed.notify_all()

    def launch(self, job_overrides, initial_job_idx, wait_s: float = 20):
        from types import SimpleNamespace

        returns = []
        for number, overrides in enumerate(job_overrides, start=initial_job_idx):
            self.record(("start", number))
            if number == 0:
                with self.changed:
                    self.changed.wait_for(lambda: self.until in self.events, timeout=wait_s)
            run_dir = self.sweep_dir / str(number)
            run_dir.mkdir(parents=True)
            (run_dir / "overrides.txt").write_text("\n".join(overrides))
            x = float(next(o for o in overrides if o.startswith("x=")).split("=")[1])
            status = {"status": self.second} if number == 1 else {"status": "ok", "val": {"acc": x}}
            (run_dir / "summary.json").write_text(json.dumps(status))
            self.record(("end", number))
            config = OmegaConf.create({"hydra": {"runtime": {"output_dir": str(run_dir)}}})
            returns.append(SimpleNamespace(hydra_cfg=config))
        return returns


def sweep_in_process(sweep_dir: Path, launcher, **settings) -> list:
    """Run the Optuna sweeper in this process with ``launcher``, ``x=choice(1, 2, 3, 4, 5)``
    on a grid, the study 's' in the sweep directory's journal; returns the study's trials."""
    import functools
    from types import SimpleNamespace

    from tuneup.optuna.study import open_storage
    from tuneup.optuna.sweeper import OptunaSearch, Settings

    node = OmegaConf.create(
        {
            "objectives": ["val.acc"],
            "direction": "maximize",
            "n_jobs": 2,
            "study_name": "s",
            "storage": None,
            "params": {"x": "choice(1, 2, 3, 4, 5)"},
            **settings,
        }
    )
    grid = functools.partial(optuna.samplers.GridSampler, seed=0)  # as Hydra makes it
    search = OptunaSearch(grid, optuna.pruners.NopPruner(), node)
    search.settings = Settings.from_node(node)
    sampler = {"_target_": "optuna.samplers.GridSampler", "_partial_": True, "seed": 0}
    search.config = OmegaConf.create(
        {"hydra": {"sweep": {"dir": str(sweep_dir)}, "sweeper": {"sampler": sampler}}}
    )
    refuse = SimpleNamespace(load_sweep_config=lambda *a: (_ for _ in ()).throw(ValueError()))
    search.hydra_context = SimpleNamespace(config_loader=refuse)  # the space: not checked first
    search.launcher = launcher
    search.sweep([])
    journal = open_storage(str(sweep_dir / "optuna.journal"))
    return optuna.load_study(study_name="s", storage=journal).get_trials()


class GridLauncher:
    """Jobs in the calling thread, each a summary.json whose val.acc is its ``x``."""

    def __init__(self, sweep_dir: Path) -> None:
        self.sweep_dir = sweep_dir

    def launch(self, job_overrides, initial_job_idx):
        from types import SimpleNamespace

        returns = []
        for number, overrides in enumerate(job_overrides, start=initial_job_idx):
            run_dir = self.sweep_dir / str(number)
            run_dir.mkdir(parents=True)
            x = float(next(o for o in overrides if o.startswith("x=")).split("=")[1])
            (run_dir / "summary.json").write_text(json.dumps({"status": "ok", "val": {"acc": x}}))
            config = OmegaConf.create({"hydra": {"runtime": {"output_dir": str(run_dir)}}})
            returns.append(SimpleNamespace(hydra_cfg=config))
        return returns


def test_a_continued_grid_runs_every_point_once(tmp_path):
    """A grid sweep stopped after 2 of its 5 points and continued to 5 runs the 3 points left,
    none again (the continued sampler reseeded drew the grid in another order)."""
    sweep_dir = tmp_path / "sweep"
    first = sweep_in_process(sweep_dir, GridLauncher(sweep_dir), n_trials=2)
    assert len(first) == 2
    trials = sweep_in_process(sweep_dir, GridLauncher(sweep_dir), n_trials=5)
    assert sorted(t.params["x"] for t in trials) == [1, 2, 3, 4, 5]


def test_a_worker_asks_the_next_trial_when_its_own_ends_not_when_the_batch_does(tmp_path):
    """n_jobs=2: trial 1 is pruned while trial 0 runs on; trial 2 is asked and launched then,
    before trial 0 ends (a batch of 2 would wait for trial 0). Each trial a job of its own,
    numbered as the trial; the study ends with n_trials finished trials, none repeated."""
    sweep_dir = tmp_path / "sweep"
    launcher = SlowFirstLauncher(sweep_dir, until=("start", 2), second="pruned")
    trials = sweep_in_process(sweep_dir, launcher, n_trials=4)

    events = launcher.events
    assert events.index(("end", 1)) < events.index(("start", 2)) < events.index(("end", 0))
    assert [t.state.name for t in trials] == ["COMPLETE", "PRUNED", "COMPLETE", "COMPLETE"]
    assert trials[2].datetime_start < trials[0].datetime_complete  # told in the storage too
    assert sorted(p.name for p in sweep_dir.iterdir() if p.is_dir()) == ["0", "1", "2", "3"]
    for trial in trials:  # job number = trial number: its directory has its values
        overrides = (sweep_dir / str(trial.number) / "overrides.txt").read_text().splitlines()
        assert f"x={trial.params['x']}" in overrides
        assert f"hydra.sweeper.trial={trial.number}" in overrides
    assert len({t.params["x"] for t in trials}) == 4  # no point asked twice


def test_past_max_failure_rate_no_trial_is_asked_and_the_running_ones_are_told(tmp_path):
    """max_failure_rate=0.5: trial 1 fails while trial 0 runs (1 of 1 finished: past it); no
    other trial is asked, and trial 0, which ends after, is told its result."""
    sweep_dir = tmp_path / "sweep"
    launcher = SlowFirstLauncher(sweep_dir, until=("end", 1), second="failed")
    trials = sweep_in_process(sweep_dir, launcher, n_trials=4, max_failure_rate=0.5)
    assert [t.state.name for t in trials] == ["COMPLETE", "FAIL"]
    assert launcher.events == [("start", 0), ("start", 1), ("end", 1), ("end", 0)]


def test_launchers_that_run_jobs_in_this_process_get_one_worker():
    """The basic launcher runs its jobs in the sweeping process and joblib's with n_jobs=1 too:
    their jobs are launched one at a time, whatever hydra.sweeper.n_jobs; joblib's n_jobs caps
    the workers."""
    from hydra._internal.core_plugins.basic_launcher import BasicLauncher
    from hydra_plugins.hydra_joblib_launcher.joblib_launcher import JoblibLauncher

    from tuneup.optuna.workers import worker_count

    assert worker_count(BasicLauncher(), 4) == 1
    assert worker_count(JoblibLauncher(n_jobs=1), 4) == 1
    assert worker_count(JoblibLauncher(n_jobs=2), 4) == 2
    assert worker_count(JoblibLauncher(n_jobs=8), 4) == 4
    assert worker_count(object(), 4) == 4  # submitit's and others: as many as asked


def test_two_joblib_workers_share_the_study_without_a_batch_barrier(tmp_path):
    """``hydra.sweeper.n_jobs=2`` under joblib's 2 processes, 3 trials of a grid, one of them
    longer (32x the samples): whichever of the first two trials ends first, the third is asked
    (its ``datetime_start`` in the storage) after that one is told and before the other is,
    which a batch of 2 would wait for. Each trial is its own job, numbered as the trial (its
    directory and ``hydra.job.num``); the study ends with exactly 3 finished trials, no point
    asked twice; the sweep's multirun.yaml and reports cover the 3 runs."""
    from tuneup.optuna.study import open_storage

    done, sweep_dir = sweep(
        tmp_path,
        *SHORT,
        "hydra/sweeper/sampler=grid",
        "data.train_samples=choice(64,96,2048)",
        "hydra.sweeper.n_trials=3",
        "hydra.sweeper.n_jobs=2",
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2",
    )
    ok(done)
    journal = open_storage(str(sweep_dir / "optuna.journal"))
    trials = optuna.load_study(study_name="tuneup", storage=journal).get_trials()
    assert [t.state.name for t in trials] == ["COMPLETE"] * 3
    first, other = sorted(trials[:2], key=lambda t: t.datetime_complete)
    assert other.datetime_start < first.datetime_complete  # the two ran at once
    assert first.datetime_complete < trials[2].datetime_start < other.datetime_complete
    assert sorted(t.params["data.train_samples"] for t in trials) == [64, 96, 2048]
    assert sorted(p.name for p in sweep_dir.iterdir() if p.is_dir()) == ["0", "1", "2"]
    for trial in trials:
        hydra = OmegaConf.load(sweep_dir / str(trial.number) / ".hydra" / "hydra.yaml").hydra
        assert hydra.job.num == hydra.sweeper.trial == trial.number
        assert f"data.train_samples={trial.params['data.train_samples']}" in hydra.overrides.task
        assert summary(sweep_dir / str(trial.number))["val"]["acc"] == trial.value
    assert OmegaConf.load(sweep_dir / "multirun.yaml").hydra.sweeper.n_jobs == 2
    assert "3 runs, 3 finished, 0 not." in (sweep_dir / "report.md").read_text()
    assert "Trials: 3: 3 complete." in (sweep_dir / "optuna_report.md").read_text()


def dead_pid() -> int:
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


def killed_while_running(tmp_path, *args, trial: int = 0, started: str = "") -> None:
    """Start ``run.py -m ARGS`` and kill it (SIGKILL: no clean-up) once its trial ``trial``
    runs (once its run directory holds ``started``, when given)."""
    sweep_dir = tmp_path / "sweep"
    command = [*python(), str(ROOT / "run.py"), "-m", f"hydra.sweep.dir={sweep_dir}", *args]
    process = subprocess.Popen(
        command, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 240
    while not (sweep_dir / str(trial) / started).exists() and process.poll() is None:
        assert time.monotonic() < deadline, f"the sweep's trial {trial} never started"
        time.sleep(0.05)
    process.kill()
    process.wait()
    assert process.returncode == -signal.SIGKILL  # killed, not finished


def wait_until_gone(study) -> None:
    """Until the process of the study's running trial is gone (the zygote ends the trial's
    process after its client is killed)."""
    from tuneup.optuna.study import SWEEPER_ATTR, is_gone

    owner = next(t for t in study.trials if t.state.name == "RUNNING").user_attrs[SWEEPER_ATTR]
    deadline = time.monotonic() + 30
    while not is_gone(owner):
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_a_killed_sweep_continues_with_new_values_exits_0_and_prunes_hopeless_trials(tmp_path):
    """Killed (SIGKILL) in its third trial, then the same command in the same sweep directory:
    the seeded sampler does not draw the first process's values again, the killed trial's values
    are run again once, and the killed trial, which does not count, does not fail the sweep.
    Then the same study (its journal named as the storage) with a hopeless learning-rate range:
    each new trial is worse than the others at its first validation (step 2 of 4) and is
    stopped there. One study for both (a sweep's process costs some 2 CPU-seconds)."""
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    from tuneup.optuna.study import INTERRUPTED_ATTR

    study_args = ["hydra.sweeper.objectives=[val.loss]", "hydra.sweeper.direction=minimize"]
    args = [
        *SHORT,
        *study_args,
        "hydra.sweeper.n_trials=4",
        "optimizer.lr=tag(log,interval(1e-3,0.3))",
        "optimizer.weight_decay=interval(0,0.1)",
    ]
    killed_while_running(tmp_path, *args, trial=2, started=".hydra/overrides.yaml")  # Hydra's last
    path = tmp_path / "sweep" / "optuna.journal"
    journal = JournalStorage(JournalFileBackend(str(path)))
    wait_until_gone(optuna.load_study(study_name="tuneup", storage=journal))
    done, sweep_dir = sweep(tmp_path, *args)
    ok(done)  # exit code 0: the killed trial is no failure

    study = optuna.load_study(study_name="tuneup", storage=journal)
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 2 + ["FAIL"] + ["COMPLETE"] * 2
    first, killed, again, new = study.trials[:2], study.trials[2], study.trials[3], study.trials[4:]
    assert killed.user_attrs[INTERRUPTED_ATTR] and again.params == killed.params  # run again, once
    drawn = [t.params for t in [*first, killed]]
    assert all(t.params not in drawn for t in new), [t.params for t in study.trials]
    assert summary(sweep_dir / "2")["status"] == "interrupted"
    assert summary(sweep_dir / "3")["steps"] == 4
    report = (sweep_dir / "report.md").read_text()
    rows = {run_name(r): r for r in read_table(report)}
    assert rows["2"]["status"].startswith("interrupted: the sweep was killed while trial 2 ran")
    assert rows["2"]["status"].endswith("its values run again as trial 3")
    assert "did not finish" not in done.stdout + done.stderr
    assert "5 runs, 4 finished, 0 not, 1 interrupted and run again." in report
    states = [r["state"] for r in read_table((sweep_dir / "optuna_report.md").read_text())]
    assert states[2:4] == ["fail (interrupted)", "complete (retry of 2)"]

    (tmp_path / "pruned").mkdir()
    done, sweep_dir = sweep(
        tmp_path / "pruned",
        *SHORT,
        *study_args,
        "hydra.sweeper.n_trials=6",
        f"hydra.sweeper.storage={path}",
        "hydra.sweeper.pruner.n_startup_trials=1",
        "optimizer.lr=tag(log,interval(1e3,1e4))",
    )
    ok(done)  # pruned trials are no failures
    study = optuna.load_study(study_name="tuneup", storage=journal)
    assert [t.state.name for t in study.trials[5:]] == ["PRUNED", "PRUNED"]  # 4 finished, then 6
    assert sorted(p.name for p in sweep_dir.iterdir() if p.is_dir()) == ["5", "6"]  # none again
    for trial in study.trials[5:]:
        run = summary(sweep_dir / str(trial.number))  # job number = trial number
        assert run["status"] == "pruned"
        assert run["steps"] == run["pruned"]["step"] == trial.last_step == 2  # of 4
        assert 1e3 <= trial.params["optimizer.lr"] <= 1e4
    best = min((t for t in study.trials if t.state.name == "COMPLETE"), key=lambda t: t.value)
    markdown = (sweep_dir / "optuna_report.md").read_text()
    assert f"**Best: trial {best.number}**" in markdown
    pruned = markdown.split("## Pruned trials")[1]
    assert "| 5 | 2 |" in pruned and "| 6 | 2 |" in pruned  # trial, the step it stopped at
    assert [r["status"] for r in read_table((sweep_dir / "report.md").read_text())] == [
        "pruned",
        "pruned",
    ]


def test_an_objective_the_runs_never_log_is_refused_before_any_trial(tmp_path):
    """``val.f1``: the task logs val/loss and val/acc; one line, exit code 1, no trial trained."""
    done, sweep_dir = sweep(tmp_path, *SHORT, "hydra.sweeper.objectives=[val.f1]")
    assert done.returncode == 1
    assert done.stderr.strip() == (
        "error: hydra.sweeper.objectives: val.f1 is not logged by this run: task=classification "
        "logs val/loss, val/acc at each validation; give one of val.loss, val.acc, or a figure "
        "of summary.json (samples_per_s, peak_memory_bytes...)"
    )
    assert not (sweep_dir / "0").exists()


def test_a_swept_key_the_model_does_not_take_is_refused_before_any_trial(tmp_path):
    """``model.lr`` on a built-in model without that setting: every trial would train the same
    and the study would report model.lr as part of the answer; one line, exit code 1."""
    done, sweep_dir = sweep(tmp_path, *SHORT, "model.lr=tag(log, interval(1e-3, 1e-1))")
    assert done.returncode == 1
    assert done.stderr.strip() == (
        "error: model.lr is not a setting of model=small_resnet; its settings are: blocks, width"
    )
    assert not (sweep_dir / "0").exists() and not (sweep_dir / "optuna.journal").exists()


def test_a_trial_without_its_objective_fails_and_so_does_the_sweep(tmp_path):
    """A figure the run does not write (time to target, without a target): the trial failed,
    its run's summary says why, the report lists it, and the sweep exits 1 (as for any failed
    trial)."""
    done, sweep_dir = sweep(
        tmp_path,
        *SHORT,
        "hydra.sweeper.n_trials=1",
        "hydra.sweeper.objectives=[time_to_target_s]",
        "hydra.sweeper.direction=minimize",
    )
    assert done.returncode == 1, done.stderr[-2000:]
    run = summary(sweep_dir / "0")
    assert run["status"] == "failed" and run["steps"] == 4  # it trained, then failed as a trial
    assert run["error"].startswith("hydra.sweeper.objectives: time_to_target_s not a number in")
    assert "its numbers: " in run["error"] and " samples_per_s, " in run["error"]
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    journal = JournalStorage(JournalFileBackend(str(sweep_dir / "optuna.journal")))
    study = optuna.load_study(study_name="tuneup", storage=journal)
    assert [t.state.name for t in study.trials] == ["FAIL"]
    (row,) = read_table((sweep_dir / "report.md").read_text())
    assert row["status"].startswith("failed: hydra.sweeper.objectives: time_to_target_s")
    assert "1 of 1 runs did not finish" in done.stdout + done.stderr


def test_two_objectives_give_a_pareto_front(tmp_path):
    """Through the installed ``tuneup`` command outside the checkout, as a user runs it: Hydra's
    plugin scan does not see an editable install's hydra_plugins there (the preset's callback
    registers the sweeper: tuneup/optuna/callback.py)."""
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    sweep_dir = tmp_path / "sweep"
    command = [
        *python(),
        str(Path(sys.executable).parent / "tuneup"),
        "-m",
        f"hydra.sweep.dir={sweep_dir}",
        *SHORT,
        "hydra.sweeper.objectives=[val.acc,samples_per_s]",
        "hydra.sweeper.direction=[maximize,maximize]",
        "hydra.sweeper.n_trials=3",
        "model.width=choice(2,4,8)",
    ]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    ok(done)
    journal = JournalStorage(JournalFileBackend(str(sweep_dir / "optuna.journal")))  # the default
    study = optuna.load_study(study_name="tuneup", storage=journal)
    assert len(study.trials) == 3 and all(t.state.name == "COMPLETE" for t in study.trials)
    for trial in study.trials:
        run = summary(sweep_dir / str(trial.number))
        assert trial.values == [
            pytest.approx(run["val"]["acc"]),
            pytest.approx(run["samples_per_s"]),
        ]
    front = sorted(t.number for t in study.best_trials)
    markdown = (sweep_dir / "optuna_report.md").read_text()
    assert f"**Pareto front: trials {', '.join(map(str, front))}**" in markdown
    assert png_size(sweep_dir / "pareto.png") == (700, 500)
    results = OmegaConf.load(sweep_dir / "optimization_results.yaml")
    assert sorted(s.trial for s in results.solutions) == front


@pytest.mark.parametrize("where", ["sqlite", "journal"])
def test_a_storage_that_cannot_be_written_is_one_line_before_any_trial(tmp_path, where):
    """A database in a folder that does not exist, a journal file under a file: one line that
    names the storage, exit code 1, and no trial run (not SQLAlchemy's two tracebacks)."""
    (tmp_path / "a_file").write_text("")
    storage = {
        "sqlite": f"sqlite:///{tmp_path / 'missing' / 'optuna.db'}",
        "journal": str(tmp_path / "a_file" / "optuna.journal"),
    }[where]
    done, sweep_dir = sweep(tmp_path, *SHORT, f"hydra.sweeper.storage={storage}")
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [done.stderr.strip()], done.stderr
    assert done.stderr.startswith(f"error: hydra.sweeper.storage={storage}: cannot open or write")
    hint = {
        "sqlite": f"the folder {tmp_path / 'missing'} does not exist",
        "journal": f"{tmp_path / 'a_file'} is not a folder",
    }[where]
    assert hint in done.stderr and "Traceback" not in done.stdout + done.stderr
    assert not (sweep_dir / "0").exists()  # no trial ran


def test_a_database_url_with_a_password_is_warned_about_and_shown_without_it(caplog):
    """Hydra writes the storage URL into the sweep's files: a password in it is warned about,
    and the error of a server that does not answer shows it as ***."""
    from tuneup import TuneupError
    from tuneup.optuna.study import open_storage

    url = "postgresql+psycopg://tuneup:s3cret@127.0.0.1:1/studies?connect_timeout=2"
    with pytest.raises(TuneupError) as refused:
        open_storage(url)
    assert "s3cret" not in str(refused.value) and "tuneup:***@127.0.0.1:1" in str(refused.value)
    assert "holds a password, which Hydra writes into the sweep's multirun.yaml" in caplog.text
    caplog.clear()
    with pytest.raises(TuneupError):
        open_storage(url.replace(":s3cret", ""))
    assert "password" not in caplog.text
