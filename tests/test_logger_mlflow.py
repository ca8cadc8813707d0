"""logger=mlflow: a run read back from its MLflow store (the run directory's SQLite one) has the
resolved config as params, the metrics summary.json has, summary.json as an artifact, and the
race figures when the summary has them; a missing package is a one-line error. metrics.csv is
written beside it; every tool numbers a validation by the optimizer steps done; a killed and
resumed run has one value per step; a pruned Optuna trial is no failure."""

from __future__ import annotations

import csv
import hashlib
import importlib.util
import json
import os
from pathlib import Path

import pytest

import tuneup
from tests.conftest import compose_config, register_in_runs, run_cli
from tuneup import hookimpl
from tuneup.plugins.logger import Plugin, summary_metrics
from tuneup.trainer.plugin_manager import PluginError

if importlib.util.find_spec("mlflow") is None:  # imported where a test reads a store: the
    # other worker, which collects this file too, need not import it (0.6 CPU-s)
    pytest.skip("the tuneup[mlflow] extra is not installed", allow_module_level=True)


def mlflow_client(uri: str):
    """MLflow's client of the store at ``uri``."""
    import mlflow

    return mlflow.MlflowClient(uri)


class CrashAt:
    """Fails the run at micro-batch ``at`` (counted over this process's runs): a session that
    ends past its last checkpoint, as a killed one does."""

    def __init__(self, at: int) -> None:
        self.at, self.micro_batches = at, 0

    @hookimpl
    def on_after_backward(self):
        self.micro_batches += 1
        if self.micro_batches == self.at:
            raise RuntimeError("crashed on purpose")


@pytest.fixture(scope="module")
def sessions(tmp_path_factory):
    """One run with logger=mlflow of 8 steps (4 an epoch), validated every 2, checkpointed every
    3, in two sessions of its run directory (one MLflow store, whose creation is much of the
    cost): the first crashes in step 6 (past its validation at 4 and its checkpoint at 3), the
    second resumes it from step 3 with a changed setting. Between them a resume on other data
    is refused as training starts (mid-epoch): the run directory's files before and after it.
    Its summary, its MLflow run and the store's client."""
    run_dir = tmp_path_factory.mktemp("mlflow") / "run"
    common = [
        "logger=mlflow",
        "data.train_samples=64",
        "data.val_samples=32",
        "data.image_size=8",
        "data.batch_size=16",
        "trainer.max_epochs=2",
        "target.metric=val/acc",
        "target.check_every_n_steps=2",
        "checkpoint.every_n_steps=3",
        "checkpoint.every_n_epochs=0",
    ]
    with pytest.MonkeyPatch.context() as patch:
        register_in_runs(patch, [CrashAt(6)])
        with pytest.raises(PluginError, match="crashed on purpose"):
            tuneup.run(compose_config([*common, "optimizer.lr=0.05"]), run_dir=run_dir)
    before = snapshot(run_dir)
    with pytest.raises(tuneup.TuneupError, match="cannot resume mid-epoch") as refusal:
        tuneup.run(
            compose_config([*common, "resume=auto", "data.train_samples=128"]), run_dir=run_dir
        )
    refused = (before, snapshot(run_dir), str(refusal.value))
    tuneup.run(compose_config([*common, "resume=auto", "optimizer.lr=0.02"]), run_dir=run_dir)
    client = mlflow_client(f"sqlite:///{run_dir / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("tuneup")
    (found,) = client.search_runs([experiment.experiment_id])
    summary = json.loads((run_dir / "summary.json").read_text())
    return {"logged": (summary, found, client, run_dir), "refused": refused}


@pytest.fixture
def logged(sessions):
    return sessions["logged"]


def snapshot(run_dir: Path) -> dict[str, str]:
    """Each file's SHA-256 by its path in ``run_dir``."""
    return {
        str(p.relative_to(run_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in run_dir.rglob("*")
        if p.is_file()
    }


def test_a_refused_resume_leaves_the_mlflow_store_as_it_was(sessions):
    """A resume refused as training starts (other data, mid-epoch) has touched nothing: the
    MLflow store (``mlflow.db``: no run made, marked running or failed, no params or values
    deleted), its artifacts, metrics.csv, the log. The run's own resume then continues its one
    MLflow run (test_a_resumed_run_continues_its_mlflow_run)."""
    before, after, _ = sessions["refused"]
    assert "mlflow.db" in before and "summary.json" in before
    assert after == before


def test_metrics_are_the_runs_and_the_summarys(logged):
    summary, found, client, run_dir = logged
    assert summary["status"] == "ok" and found.info.status == "FINISHED"
    assert found.info.run_name == f"{run_dir.parent.name}/run"  # the run directory's last parts
    assert found.data.tags["tuneup.run_dir"] == str(run_dir.resolve())
    store = summary["plugins"]["logger"]["tracking_uri"]
    assert store == f"sqlite:///{run_dir.resolve() / 'mlflow.db'}"
    metrics = found.data.metrics
    assert metrics["val/acc"] == pytest.approx(summary["val"]["acc"], rel=1e-6)
    assert metrics["val/loss"] == pytest.approx(summary["val"]["loss"], rel=1e-6)
    assert client.get_metric_history(found.info.run_id, "train/loss")  # logged as it trained
    assert metrics["fit_seconds"] == pytest.approx(summary["fit_seconds"])
    assert metrics["samples"] == summary["samples"] == 128  # 2 epochs of 64
    assert metrics["steps"] == summary["steps"]


def test_params_are_the_resolved_config_flattened(logged):
    _, found, _, _ = logged
    params = found.data.params
    assert params["optimizer.lr"] == "0.05"
    assert params["model.width"] == "8"
    assert params["logger.name"] == "mlflow"
    assert params["data.train_samples"] == "64"


def test_summary_json_is_an_artifact_equal_to_the_file(logged, tmp_path):
    summary, found, client, _ = logged
    assert [a.path for a in client.list_artifacts(found.info.run_id)] == ["summary.json"]
    local = client.download_artifacts(found.info.run_id, "summary.json", str(tmp_path))
    assert json.loads(Path(local).read_text()) == summary


def test_race_figures_are_metrics_when_the_summary_has_them():
    summary = {
        "status": "ok",
        "time_to_target_s": 12.5,
        "time_to_target_train_s": 10.0,
        "steps_to_target": 40,
        "samples_to_target": None,  # not reached by this figure: not logged
        "target": {"metric": "val/acc", "value": 0.9, "mode": "max", "reached": True, "best": 0.93},
        "target_history": [{"step": 40, "value": 0.93}],
        "val": {"acc": 0.93},  # Lightning logged it as val/acc already
    }
    assert summary_metrics(summary) == {
        "time_to_target_s": 12.5,
        "time_to_target_train_s": 10.0,
        "steps_to_target": 40.0,
        "target.value": 0.9,
        "target.reached": 1.0,
        "target.best": 0.93,
    }


def test_without_mlflow_the_check_names_the_extra(monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "mlflow" else find_spec(name, *a),
    )
    cfg = compose_config(["logger=mlflow"])
    (line,) = Plugin(cfg).check(cfg)
    assert line == (
        "logger=mlflow needs the 'mlflow' package, which is not installed: "
        "pip install 'tuneup[mlflow]', or choose logger=csv"
    )


def test_a_bad_setting_is_named():
    cfg = compose_config(["logger=mlflow", "logger.experiment_name=''"])
    (line,) = Plugin(cfg).check(cfg)
    assert line == "logger.experiment_name='' is not allowed: expected a non-empty string or null"


def test_a_resumed_run_continues_its_mlflow_run(logged):
    """Two sessions of one run directory (the second resumed with a changed setting) are one
    MLflow run: the metrics go on from the checkpoint, the first lr stays the param and the
    change is named in a tag (resume=auto is how the session started, no change of the run)."""
    summary, found, client, _ = logged
    # each run its own store, as a sweep's jobs in one process (MLflow's set_tracking_uri would
    # leave $MLFLOW_TRACKING_URI pointing at the first run's: the next would log there)
    assert "MLFLOW_TRACKING_URI" not in os.environ
    assert summary["resumed_from"].endswith("step00000003.ckpt")
    steps = [step for step, _ in history(client, found, "train/loss")]
    assert steps == list(range(1, 9))  # both sessions' steps, in one run, each once
    assert found.info.status == "FINISHED" and found.data.metrics["steps"] == 8
    assert found.data.tags["tuneup.status"] == "ok"
    assert found.data.params["optimizer.lr"] == "0.05"
    assert found.data.tags["tuneup.changed_on_resume"] == "optimizer.lr: 0.05 -> 0.02"


def csv_steps(path: Path, key: str) -> list[int]:
    with open(path) as f:
        return [int(row["step"]) for row in csv.DictReader(f) if row.get(key)]


def history(client, run, key: str) -> list[tuple[int, float]]:
    return [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)]


def test_metrics_csv_is_written_beside_mlflow_with_its_steps(logged):
    """Scripts that read metrics.csv read it with logger=mlflow too: the rows MLflow has, at the
    same steps (the crashed session's up to its checkpoint in metrics-1.csv, kept when the
    resumed one started, which wrote metrics.csv)."""
    _, found, client, run_dir = logged
    for key in ("train/loss", "val/acc"):
        in_mlflow = [step for step, _ in history(client, found, key)]
        assert csv_steps(run_dir / "metrics.csv", key) == [s for s in in_mlflow if s > 3]
        first = [s for s in csv_steps(run_dir / "metrics-1.csv", key) if s <= 3]
        assert first == [s for s in in_mlflow if s <= 3]
    assert csv_steps(run_dir / "metrics.csv", "train/loss") == list(range(4, 9))


def test_a_killed_runs_steps_past_its_checkpoint_have_one_value_the_resumed_sessions(logged):
    """The crashed session logged steps 4 and 5 (its validation at 4, its figures at 5) past its
    checkpoint at 3; the resumed session trained them again: one value a step, its own."""
    _, found, client, run_dir = logged
    assert csv_steps(run_dir / "metrics-1.csv", "train/loss") == [1, 2, 3, 4, 5]  # logged twice
    for key in found.data.metrics:  # every metric: the summary's figures too
        # (Lightning adds `epoch` to each of a step's rows, its training and its validation one)
        logged = history(client, found, key)
        steps = [step for step, _ in (set(logged) if key == "epoch" else logged)]
        assert len(steps) == len(set(steps)), f"{key} has steps twice: {steps}"
    for key in ("train/loss", "val/acc"):
        with open(run_dir / "metrics.csv") as f:  # the resumed session's rows
            resumed = {int(r["step"]): float(r[key]) for r in csv.DictReader(f) if r[key]}
        assert {s: v for s, v in history(client, found, key) if s > 3} == pytest.approx(resumed)


def test_a_validation_has_one_step_number_in_metrics_csv_mlflow_and_the_target_history(logged):
    """The validation after N optimizer steps is step N in each (here every 2 of 8 steps)."""
    summary, found, client, run_dir = logged
    validated = [2, 4, 6, 8]
    assert [entry["step"] for entry in summary["target_history"]] == validated
    assert [step for step, _ in history(client, found, "val/acc")] == validated
    assert csv_steps(run_dir / "metrics-1.csv", "val/acc") == [2, 4]  # the crashed session's
    assert csv_steps(run_dir / "metrics.csv", "val/acc") == [4, 6, 8]
    assert summary["target"]["best_step"] in validated


def test_a_pruned_trial_is_finished_in_mlflow_at_the_steps_optuna_has(tmp_path):
    """An Optuna trial pruned at its second validation (step 4 of 6) is FINISHED in MLflow with
    the tag tuneup.status=pruned, not FAILED; Optuna's intermediate values, metrics.csv, MLflow
    and the target's history number its validations alike."""
    optuna = pytest.importorskip("optuna")
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    done = run_cli(
        "-m",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        "hparams_search=optuna",
        "hydra.sweeper.params=null",
        "hydra.sweeper.n_trials=1",
        "hydra/sweeper/sampler=random",
        f"hydra.sweeper.storage={storage}",
        # val/acc below 1.5 past the warm-up (step 3): pruned at the first validation after it
        "hydra/sweeper/pruner=none",
        "hydra.sweeper.pruner._target_=optuna.pruners.ThresholdPruner",
        "+hydra.sweeper.pruner.lower=1.5",
        "+hydra.sweeper.pruner.n_warmup_steps=3",
        "logger=mlflow",
        "data.train_samples=192",
        "data.val_samples=32",
        "data.batch_size=32",
        "data.image_size=8",
        "model.width=4",
        "trainer.max_epochs=1",
        "target.metric=val/acc",
        "target.check_every_n_steps=2",
        "trainer.enable_progress_bar=false",
        "~hydra.callbacks.sweep_report",  # its report.png is no part of this (matplotlib's CPU)
        cwd=tmp_path,
        tiny=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (trial,) = optuna.load_study(study_name="tuneup", storage=storage).trials
    run_dir = tmp_path / "sweep" / "0"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert trial.state.name == "PRUNED" and summary["status"] == "pruned"
    assert summary["pruned"]["step"] == 4
    client = mlflow_client(f"sqlite:///{run_dir / 'mlflow.db'}")
    (found,) = client.search_runs([client.get_experiment_by_name("tuneup").experiment_id])
    assert found.info.status == "FINISHED" and found.data.tags["tuneup.status"] == "pruned"
    validated = [2, 4]
    assert sorted(trial.intermediate_values) == validated
    assert [step for step, _ in history(client, found, "val/acc")] == validated
    assert csv_steps(run_dir / "metrics.csv", "val/acc") == validated
    assert [entry["step"] for entry in summary["target_history"]] == validated
    assert [v for _, v in history(client, found, "val/acc")] == pytest.approx(
        [trial.intermediate_values[s] for s in validated]
    )


def test_a_store_without_sql_keeps_the_stale_values_and_says_so(tmp_path, monkeypatch, caplog):
    """MLflow's client cannot delete a metric's values: a store that is no SQL database (a
    server; here MLflow's file store) keeps an earlier session's steps, and the run warns."""
    from types import SimpleNamespace

    from tuneup.plugins.logger.mlflow_resume import drop_values_after

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = (tmp_path / "mlruns").as_uri()
    client = mlflow_client(uri)
    run = client.create_run(client.create_experiment("tuneup"))
    for step in (4, 8):
        client.log_metric(run.info.run_id, "val/acc", 0.5, step=step)
    client.log_metric(run.info.run_id, "train/loss", 2.0, step=5)
    session = SimpleNamespace(experiment=client, run_id=run.info.run_id)
    drop_values_after(session, 5, uri)
    (line,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert line == (
        f"logger=mlflow: {uri} keeps an earlier session's values of val/acc past step 5, where "
        "this session goes on: MLflow's client cannot delete them (an SQL store's are deleted), "
        "so those steps have two values each"
    )
    assert [m.step for m in client.get_metric_history(run.info.run_id, "val/acc")] == [4, 8]
