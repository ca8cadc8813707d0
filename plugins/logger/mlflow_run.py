"""``logger=mlflow``: the run's MLflow run, beyond what Lightning's ``MLFlowLogger`` logs.

The resolved config as params (when the run is accepted: training starts, every check
passed; nothing is written into the store before, :mod:`.held`); at the end (the ``report``
hook, last) the summary's figures as metrics, ``summary.json`` as an artifact, the run's
status and the tag ``tuneup.status``. Its store is ``logger.tracking_uri`` (a server: ``http://host:5000``),
else ``$MLFLOW_TRACKING_URI``, else ``mlflow.db`` in the run directory: an SQLite store, which
MLflow 3 recommends (its file store, ``mlruns/``, refuses to open unless
``MLFLOW_ALLOW_FILE_STORE=true``), with the artifacts in ``mlartifacts/`` beside it.

A resumed run continues its MLflow run, its stale values deleted (:mod:`.mlflow_resume`). A
setting changed on resume keeps the first session's param (MLflow refuses to change one) and
is named in the tag ``tuneup.changed_on_resume`` (:func:`log_params`).
"""

from __future__ import annotations

import importlib.util
import logging
import math
import os
import re
import tempfile
from pathlib import Path

from lightning_fabric.utilities.rank_zero import rank_zero_only
from omegaconf import OmegaConf
from omegaconf.errors import InterpolationResolutionError
from pytorch_lightning.loggers import MLFlowLogger

from tuneup.trainer import summary as run_summary
from tuneup.trainer.validation import problem

from .held import Held
from .mlflow_resume import earlier_run

#: What MLflow's SQL stores (sqlite:///..., the default) need beyond mlflow-skinny.
SQL_STORE_NEEDS = ("sqlalchemy", "alembic")
STORE_FILE, ARTIFACT_DIR = "mlflow.db", "mlartifacts"
#: The MLflow run's status for each summary status; anything else is FAILED. A pruned trial
#: ended as the sweep meant it to, at a step of its pruner's choosing, with its checkpoint and
#: summary written (as EarlyStopping ends a run): FINISHED, and the tag ``tuneup.status`` says
#: ``pruned``. KILLED is for runs stopped from outside that ``resume=auto`` continues.
MLFLOW_STATUS = {
    "ok": "FINISHED",
    "pruned": "FINISHED",
    "interrupted": "KILLED",
    "preempted": "KILLED",
}
STATUS_TAG = "tuneup.status"
#: Settings that differ between sessions of one run by their nature, not changes of the run.
SESSION_KEYS = ("resume",)
#: Summary entries that are no figures of the run (or are logged by Lightning as they happen).
NOT_FIGURES = ("plugins", "val", "run_dir", "resumed_from", "world_size")


def mlflow_store(settings, save_dir: str) -> tuple[str, str | None]:
    """The tracking URI and the artifact location of a new experiment (None: the store's
    default; an SQLite file's: ``mlartifacts/`` beside it). Without ``tracking_uri`` or
    ``$MLFLOW_TRACKING_URI``: the run directory's own SQLite file."""
    uri = settings.get("tracking_uri") or os.environ.get("MLFLOW_TRACKING_URI")
    uri = str(uri) if uri else f"sqlite:///{Path(save_dir).resolve() / STORE_FILE}"
    artifacts = settings.get("artifact_location")
    if artifacts is None and uri.startswith("sqlite:///"):  # beside the file, not in the cwd
        database = Path(uri.removeprefix("sqlite:///"))
        artifacts = (database.resolve().parent / ARTIFACT_DIR).as_uri()
    return uri, artifacts


def build_mlflow_logger(settings, save_dir: str):
    uri, artifacts = mlflow_store(settings, save_dir)
    # Lightning says so at each new experiment, and MLflow at each new store: the run
    # directory's own store and experiment are new in every run, so that is no news.
    logging.getLogger("pytorch_lightning.loggers.mlflow").addFilter(
        lambda record: "not found. Creating it." not in record.getMessage()
    )
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)
    return MLflowRun(
        save_dir,
        experiment_name=settings.get("experiment_name") or "tuneup",
        # MLflow's made-up names come from the seeded `random`: every run would get the same.
        run_name=settings.get("run_name") or "/".join(Path(save_dir).resolve().parts[-2:]),
        tracking_uri=uri,
        tags={"tuneup.run_dir": str(Path(save_dir).resolve())},
        artifact_location=artifacts,
    )


class MLflowRun(Held, MLFlowLogger):
    """Lightning's ``MLFlowLogger``, held until the run is accepted (:mod:`.held`): then it
    continues the run directory's earlier MLflow run (:func:`earlier_run`) or makes one."""

    def __init__(self, run_dir: str, **kwargs) -> None:
        self.run_dir = run_dir
        super().__init__(**kwargs)

    def start(self) -> None:
        if rank_zero_only.rank != 0:
            return
        self._run_id = earlier_run(self._tracking_uri, self._experiment_name, self.run_dir)
        previous = os.environ.get("MLFLOW_TRACKING_URI")
        # Lightning points MLflow at the store when it makes the run, with mlflow.set_tracking_uri,
        # which also sets $MLFLOW_TRACKING_URI: the next job of a sweep in this process would read
        # it as the user's and log into this run's store. Made now, then MLflow's default put back.
        if self.experiment is not None and os.environ.get("MLFLOW_TRACKING_URI") != previous:
            import mlflow

            mlflow.set_tracking_uri(previous)


def log_params(logger, params: dict[str, str]) -> None:
    """The params of the run; on a continued MLflow run, those it has not got yet, and the
    changed ones named in the tag ``tuneup.changed_on_resume`` (MLflow keeps a param's first
    value and refuses another). ``resume`` is how a session started, not a change of the run."""
    client, run_id = logger.experiment, logger.run_id
    earlier = client.get_run(run_id).data.params
    changed = sorted(
        k
        for k, v in params.items()
        if k in earlier and earlier[k] != v[:250] and k not in SESSION_KEYS
    )
    logger.log_hyperparams({k: v for k, v in params.items() if k not in earlier})
    if changed:
        client.set_tag(
            run_id,
            "tuneup.changed_on_resume",
            "; ".join(f"{k}: {earlier[k]} -> {params[k]}" for k in changed)[:5000],
        )


def flat_params(cfg) -> dict[str, str]:
    """The resolved config as MLflow params: ``{"optimizer.lr": "0.1", ...}``."""
    flat: dict[str, str] = {}

    def walk(node, prefix: str) -> None:
        if isinstance(node, dict) and node:
            for key, value in node.items():
                walk(value, f"{prefix}{key}.")
        else:
            flat[prefix.rstrip(".")] = str(node)

    try:
        node = OmegaConf.to_container(cfg, resolve=True)
    except InterpolationResolutionError:  # ${hydra:...} in a run not started by Hydra
        node = OmegaConf.to_container(cfg, resolve=False)
    walk(node, "")
    return flat


def summary_metrics(summary: dict) -> dict[str, float]:
    """The summary's numbers (``time_to_target_s``, ``samples_per_s``, ``target.best``...) as
    MLflow metrics; a bool (``target.reached``) as 1.0 or 0.0; lists and null left out."""
    found: dict[str, float] = {}

    def walk(node: dict, prefix: str) -> None:
        for key, value in node.items():
            if isinstance(value, dict):
                walk(value, f"{prefix}{key}.")
            elif isinstance(value, int | float) and math.isfinite(value):  # MLflow's key characters
                found[re.sub(r"[^\w/. -]", "_", f"{prefix}{key}")] = float(value)

    walk({k: v for k, v in summary.items() if k not in NOT_FIGURES}, "")
    return found


def log_run_end(logger, summary: dict) -> None:
    """Log the summary's figures and ``summary.json`` to the logger's MLflow run, and end it
    with the run's status (Lightning ended it FINISHED when the fit ended) and the summary's
    status as the tag ``tuneup.status`` (``pruned``: FINISHED in MLflow's terms)."""
    from mlflow.entities import Metric

    client, run_id = logger.experiment, logger.run_id
    step = int(summary.get("steps") or 0)
    metrics = [Metric(k, v, 0, step) for k, v in summary_metrics(summary).items()]
    for start in range(0, len(metrics), 1000):  # MLflow takes up to 1000 metrics a batch
        client.log_batch(run_id, metrics=metrics[start : start + 1000])
    with tempfile.TemporaryDirectory() as folder:
        # The file as the run writes it next (trainer/run_report.py adds only how it was started).
        from tuneup.trainer.state.preemption import command_name

        written = run_summary.write({"command": command_name(), **summary}, Path(folder))
        client.log_artifact(run_id, str(written))
    status = str(summary.get("status"))
    client.set_tag(run_id, STATUS_TAG, status)
    client.set_terminated(run_id, MLFLOW_STATUS.get(status, "FAILED"))


def mlflow_problems(settings) -> list[str]:
    # Unresolved: ${hydra:sweep.dir} resolves only in the run, not where sweeps are checked.
    settings = OmegaConf.to_container(settings, resolve=False)
    uri = settings.get("tracking_uri") or os.environ.get("MLFLOW_TRACKING_URI") or "sqlite:"
    missing = [m for m in SQL_STORE_NEEDS if importlib.util.find_spec(m) is None]
    found = []
    if str(uri).startswith(("sqlite:", "postgresql", "mysql", "mssql")) and missing:
        found.append(
            f"logger=mlflow with the store {uri!r} needs {' and '.join(map(repr, missing))}, "
            "not installed: pip install 'tuneup[mlflow]', or send the run to an MLflow server: "
            "logger.tracking_uri=http://host:5000"
        )
    for key in ("tracking_uri", "artifact_location", "experiment_name", "run_name"):
        value = settings.get(key)
        if value is not None and not (isinstance(value, str) and value.strip()):
            found.append(problem(f"logger.{key}", value, "a non-empty string or null"))
    return found
