"""tuneup's Optuna sweeper (hparams_search=optuna): the search space, pruning, several
objectives, and a study continued from its storage. The preset's default search is in
tests/test_sweep_presets.py."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from omegaconf import OmegaConf

from tests.report_tables import png_size
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
        ],  # fmt: skip  (the command line wins over the file)
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
    ]  # fmt: skip  (a string that would read back as a number stays a string)
    assert parse_space({}, ["model.width=range(4, 12, 4)"]).grid() == {"model.width": [4, 8]}
    with pytest.raises(TuneupError, match=r"grid sampler takes choice\(\) and range\(\)"):
        space.grid()
    with pytest.raises(TuneupError, match=r"cannot sample this sweep; use choice"):
        parse_space({}, ["optimizer.lr=glob(*)"])


def test_a_killed_sweeps_running_trial_is_failed_and_asked_again(tmp_path):
    from tuneup import TuneupError
    from tuneup.optuna import study as studies

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


def dead_pid() -> int:
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


def test_hopeless_trials_are_pruned_and_a_stored_study_continues(tmp_path):
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    study_args = [
        f"hydra.sweeper.storage={storage}",
        "hydra.sweeper.objectives=[val.loss]",
        "hydra.sweeper.direction=minimize",
        "hydra.sweeper.pruner.n_startup_trials=1",
    ]
    # One good trial, then the same study again with a hopeless learning-rate range: each of
    # its trials is worse than the good one at its first validation (step 2) and is stopped.
    first = tmp_path / "first"
    first.mkdir()
    done, first_dir = sweep(first, *SHORT, *study_args, "hydra.sweeper.n_trials=1",
                            "optimizer.lr=0.05")  # fmt: skip
    ok(done)
    second = tmp_path / "second"
    second.mkdir()
    done, sweep_dir = sweep(second, *SHORT, *study_args, "hydra.sweeper.n_trials=3",
                            "optimizer.lr=tag(log,interval(1e3,1e4))")  # fmt: skip
    ok(done)  # pruned trials are no failures

    study = optuna.load_study(study_name="tuneup", storage=storage)
    assert [t.state.name for t in study.trials] == ["COMPLETE", "PRUNED", "PRUNED"]
    assert summary(first_dir / "0")["steps"] == 4
    assert sorted(p.name for p in sweep_dir.iterdir() if p.is_dir()) == [
        "1",
        "2",
    ]  # trial 0 ran once
    for trial in study.trials[1:]:
        run = summary(sweep_dir / str(trial.number))  # job number = trial number
        assert run["status"] == "pruned"
        assert run["steps"] == run["pruned"]["step"] == trial.last_step == 2  # of 4
        assert 1e3 <= trial.params["optimizer.lr"] <= 1e4
    markdown = (sweep_dir / "optuna_report.md").read_text()
    assert "**Best: trial 0**" in markdown
    pruned = markdown.split("## Pruned trials")[1]
    assert "| 1 | 2 |" in pruned and "| 2 | 2 |" in pruned  # trial, the step it stopped at
    assert "pruned" in (sweep_dir / "report.md").read_text()


def test_two_objectives_give_a_pareto_front(tmp_path):
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    done, sweep_dir = sweep(
        tmp_path, *SHORT,
        "hydra.sweeper.objectives=[val.acc,samples_per_s]",
        "hydra.sweeper.direction=[maximize,maximize]",
        "hydra.sweeper.n_trials=3",
        "model.width=choice(2,4,8)",
    )  # fmt: skip
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
