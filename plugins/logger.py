"""Experiment logger, chosen by ``logger=csv|tensorboard|wandb|mlflow``; files go under the run directory.

``csv`` needs nothing beyond Lightning (a resumed run keeps the earlier
rows: ``metrics-1.csv``, ``metrics-2.csv``... in the order they were written); ``tensorboard`` needs ``tensorboard`` or
``tensorboardX`` (extra ``tuneup[tensorboard]``); ``wandb`` needs ``wandb``
(extra ``tuneup[wandb]``) and runs offline unless ``logger.offline=false``.

``mlflow`` (extra ``tuneup[mlflow]``: mlflow-skinny and the SQL store's packages) is
Lightning's ``MLFlowLogger`` plus what it does not log: the resolved config as params (at
the fit's start), and at the end (the ``report`` hook, last) the summary's figures as
metrics, ``summary.json`` as an artifact and the run's status. Its store is
``logger.tracking_uri`` (a server: ``http://host:5000``), else ``$MLFLOW_TRACKING_URI``,
else ``mlflow.db`` in the run directory: an SQLite store, which MLflow 3 recommends (its
file store, ``mlruns/``, refuses to open unless ``MLFLOW_ALLOW_FILE_STORE=true``), with the
artifacts in ``mlartifacts/`` beside it. A resumed run (``resume=``, the same run directory)
continues its MLflow run, found by its ``tuneup.run_dir`` tag: the metrics go on from the
step it stopped at; a setting changed on resume keeps the first session's param (MLflow
refuses to change one) and is named in the tag ``tuneup.changed_on_resume``.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import os
import re
import tempfile
import warnings
from pathlib import Path

from omegaconf import OmegaConf
from omegaconf.errors import InterpolationResolutionError

from tuneup import TuneupError, hookimpl
from tuneup.trainer import summary as run_summary
from tuneup.trainer.validation import OneOf, problem, problems

NEEDS = {
    "csv": (),
    "tensorboard": ("tensorboard", "tensorboardX"),
    "wandb": ("wandb",),
    "mlflow": ("mlflow",),
}
#: What MLflow's SQL stores (sqlite:///..., the default) need beyond mlflow-skinny.
SQL_STORE_NEEDS = ("sqlalchemy", "alembic")
STORE_FILE, ARTIFACT_DIR = "mlflow.db", "mlartifacts"
#: The MLflow run's status for each summary status; anything else is FAILED.
MLFLOW_STATUS = {"ok": "FINISHED", "interrupted": "KILLED", "preempted": "KILLED"}
#: Summary entries that are no figures of the run (or are logged by Lightning as they happen).
NOT_FIGURES = ("plugins", "val", "run_dir", "resumed_from", "world_size")


def keep_earlier_metrics(save_dir: str) -> Path | None:
    """Move an earlier ``metrics.csv`` (a resumed run's) to ``metrics-<n>.csv``.

    Lightning's CSV logger deletes an existing metrics.csv when it starts; a
    resumed run must not lose the rows of the runs before it.
    """
    from lightning_fabric.utilities.rank_zero import rank_zero_only

    current = Path(save_dir) / "metrics.csv"
    if rank_zero_only.rank != 0 or not current.is_file():
        return None
    n = 1
    while (kept := current.with_name(f"metrics-{n}.csv")).exists():
        n += 1
    current.rename(kept)
    return kept


def build_logger(settings, save_dir: str):
    """The Lightning logger named by ``settings.name``, writing under ``save_dir``."""
    from pytorch_lightning import loggers

    if settings.name == "csv":
        keep_earlier_metrics(save_dir)
        # It warns that the run directory is not empty (it holds .hydra/, the log file) and
        # that its files would be deleted: the only one it writes, metrics.csv, was kept above.
        warnings.filterwarnings("ignore", message=r"Experiment logs directory .* not empty")
        # Every logged row written at once (Lightning's default holds 100 in memory): a run
        # killed with -9 keeps its rows up to the kill. One appended line per logged step.
        return loggers.CSVLogger(save_dir=save_dir, name="", version="",
                                 flush_logs_every_n_steps=1)  # fmt: skip
    if settings.name == "tensorboard":
        return loggers.TensorBoardLogger(save_dir=save_dir, name="", version="")
    if settings.name == "mlflow":
        return build_mlflow_logger(settings, save_dir)
    return loggers.WandbLogger(
        save_dir=save_dir,
        project=settings.get("project", "tuneup"),
        name=settings.get("run_name"),
        offline=settings.get("offline", True),
    )


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
    from pytorch_lightning.loggers import MLFlowLogger

    uri, artifacts = mlflow_store(settings, save_dir)
    # Lightning says so at each new experiment, and MLflow at each new store: the run
    # directory's own store and experiment are new in every run, so that is no news.
    logging.getLogger("pytorch_lightning.loggers.mlflow").addFilter(
        lambda record: "not found. Creating it." not in record.getMessage()
    )
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)
    experiment = settings.get("experiment_name") or "tuneup"
    previous = os.environ.get("MLFLOW_TRACKING_URI")
    logger = MLFlowLogger(
        experiment_name=experiment,
        # MLflow's made-up names come from the seeded `random`: every run would get the same.
        run_name=settings.get("run_name") or "/".join(Path(save_dir).resolve().parts[-2:]),
        tracking_uri=uri,
        tags={"tuneup.run_dir": str(Path(save_dir).resolve())},
        artifact_location=artifacts,
        run_id=earlier_run(uri, experiment, save_dir),
    )
    # Lightning points MLflow at the store when it makes the run, with mlflow.set_tracking_uri,
    # which also sets $MLFLOW_TRACKING_URI: the next job of a sweep in this process would read
    # it as the user's and log into this run's store. Made now, then MLflow's default put back.
    if logger.experiment is not None and os.environ.get("MLFLOW_TRACKING_URI") != previous:
        import mlflow

        mlflow.set_tracking_uri(previous)
    return logger


def earlier_run(uri: str, experiment: str, save_dir: str) -> str | None:
    """The MLflow run of an earlier session of this run directory (a resumed run), or None."""
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file():
        return None  # a new run directory's own store: nothing earlier (and no store to make)
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return None
    where = str(Path(save_dir).resolve())
    # the filter's string cannot hold a quote: then the newest runs are read and matched here
    query = "" if "'" in where else f"tags.`tuneup.run_dir` = '{where}'"
    runs = [r for r in client.search_runs([found.experiment_id], query, max_results=1000,
                                          order_by=["attributes.start_time DESC"])
            if r.data.tags.get("tuneup.run_dir") == where][:1]  # fmt: skip
    if not runs:
        return None
    client.update_run(runs[0].info.run_id, status="RUNNING")
    return runs[0].info.run_id


def log_params(logger, params: dict[str, str]) -> None:
    """The params of the run; on a continued MLflow run, those it has not got yet, and the
    changed ones named in the tag ``tuneup.changed_on_resume`` (MLflow keeps a param's first
    value and refuses another)."""
    client, run_id = logger.experiment, logger.run_id
    earlier = client.get_run(run_id).data.params
    changed = sorted(k for k, v in params.items() if k in earlier and earlier[k] != v[:250])
    logger.log_hyperparams({k: v for k, v in params.items() if k not in earlier})
    if changed:
        client.set_tag(run_id, "tuneup.changed_on_resume",
                       "; ".join(f"{k}: {earlier[k]} -> {params[k]}" for k in changed)[:5000])  # fmt: skip


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
    with the run's status (Lightning ended it FINISHED when the fit ended)."""
    from mlflow.entities import Metric

    client, run_id = logger.experiment, logger.run_id
    step = int(summary.get("steps") or 0)
    metrics = [Metric(k, v, 0, step) for k, v in summary_metrics(summary).items()]
    for start in range(0, len(metrics), 1000):  # MLflow takes up to 1000 metrics a batch
        client.log_batch(run_id, metrics=metrics[start : start + 1000])
    with tempfile.TemporaryDirectory() as folder:
        # The file as the run writes it next (trainer/runner.py adds only how it was started).
        from tuneup.trainer.state.preemption import command_name

        written = run_summary.write({"command": command_name(), **summary}, Path(folder))
        client.log_artifact(run_id, str(written))
    client.set_terminated(run_id, MLFLOW_STATUS.get(summary.get("status"), "FAILED"))


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


class Plugin:
    def __init__(self, cfg) -> None:
        self.settings = cfg.logger
        self.logger = None
        self.store = None  # the MLflow tracking URI the run logs to

    def describe(self) -> dict:
        """The settings, with the MLflow store the run logs to once it is known."""
        try:
            node = OmegaConf.to_container(self.settings, resolve=True)
        except InterpolationResolutionError:  # ${hydra:sweep.dir} outside a run (sweep checks)
            node = OmegaConf.to_container(self.settings, resolve=False)
        node.pop("plugin", None)
        if self.store is not None:
            node["tracking_uri"] = self.store
        return node

    @hookimpl
    def check(self, cfg):
        found = problems(cfg, {"logger.name": OneOf(tuple(NEEDS))})
        needs = NEEDS.get(cfg.logger.name, ())
        if needs and not any(importlib.util.find_spec(m) for m in needs):
            return [
                *found,
                f"logger={cfg.logger.name} needs the '{needs[0]}' package, which is not installed: "
                f"pip install 'tuneup[{cfg.logger.name}]', or choose logger=csv",
            ]
        if cfg.logger.name == "mlflow":
            found += mlflow_problems(cfg.logger)
        return found

    @hookimpl
    def configure_trainer(self, cfg, kwargs):
        self.logger = kwargs["logger"] = build_logger(cfg.logger, kwargs["default_root_dir"])
        if cfg.logger.name == "mlflow":
            self.store = mlflow_store(cfg.logger, kwargs["default_root_dir"])[0]

    @hookimpl
    def on_fit_start(self, cfg, trainer):
        if cfg.logger.name == "mlflow" and trainer.is_global_zero:
            log_params(self.logger, flat_params(cfg))

    @hookimpl(wrapper=True)  # around the others: their figures are in the summary after yield
    def report(self, cfg, summary):
        result = yield
        if cfg.logger.name != "mlflow" or self.logger is None:
            return result
        try:
            log_run_end(self.logger, summary)
        except Exception as exc:  # the store went away: the run itself is done and kept
            raise TuneupError(
                f"logger=mlflow: the run's end was not logged to {self.store}: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        return result
