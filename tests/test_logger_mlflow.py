"""logger=mlflow: a run read back from its MLflow store (the run directory's SQLite one) has the
resolved config as params, the metrics summary.json has, summary.json as an artifact, and the
race figures when the summary has them; a missing package is a one-line error."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

import tuneup
from tests.conftest import compose_config
from tuneup.plugins.logger import Plugin, summary_metrics

mlflow = pytest.importorskip("mlflow", reason="the tuneup[mlflow] extra is not installed")


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    """One TINY run with logger=mlflow in two sessions of its run directory (the second resumed
    with a changed setting; one MLflow store, whose creation is most of the cost): its summary,
    its MLflow run and the store's client."""
    run_dir = tmp_path_factory.mktemp("mlflow") / "run"
    common = ["logger=mlflow", "data.train_samples=64", "data.val_samples=32",
              "data.image_size=8", "data.batch_size=16", "trainer.max_epochs=2"]  # fmt: skip
    tuneup.run(
        compose_config([*common, "trainer.max_steps=2", "optimizer.lr=0.05"]), run_dir=run_dir
    )
    tuneup.run(compose_config([*common, "resume=auto", "optimizer.lr=0.02"]), run_dir=run_dir)
    client = mlflow.MlflowClient(f"sqlite:///{run_dir / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("tuneup")
    (found,) = client.search_runs([experiment.experiment_id])
    return json.loads((run_dir / "summary.json").read_text()), found, client, run_dir


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
    MLflow run: the metrics go on from where the first stopped, the first lr stays the param and
    the change is named in a tag."""
    _, found, client, _ = logged
    # each run its own store, as a sweep's jobs in one process (MLflow's set_tracking_uri would
    # leave $MLFLOW_TRACKING_URI pointing at the first run's: the next would log there)
    assert "MLFLOW_TRACKING_URI" not in os.environ
    steps = [m.step for m in client.get_metric_history(found.info.run_id, "train/loss")]
    assert steps[0] < 2 and steps[-1] >= 7  # both sessions' steps (8 in all), in one run
    assert found.info.status == "FINISHED" and found.data.metrics["steps"] == 8
    assert found.data.params["optimizer.lr"] == "0.05"
    assert found.data.tags["tuneup.changed_on_resume"] == (
        "optimizer.lr: 0.05 -> 0.02; resume: None -> auto; trainer.max_steps: 2 -> -1"
    )
