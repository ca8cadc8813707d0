"""Experiment logger, chosen by ``logger=csv|tensorboard|wandb|mlflow``; files go under the run directory.

``csv`` needs nothing beyond Lightning (a resumed run keeps the earlier
rows: ``metrics-1.csv``, ``metrics-2.csv``... in the order they were written); ``tensorboard`` needs ``tensorboard`` or
``tensorboardX`` (extra ``tuneup[tensorboard]``); ``wandb`` needs ``wandb``
(extra ``tuneup[wandb]``) and runs offline unless ``logger.offline=false``.
``mlflow`` (extra ``tuneup[mlflow]``: mlflow-skinny and the SQL store's packages) is
Lightning's ``MLFlowLogger`` plus what it does not log (:mod:`.mlflow_run`), and metrics.csv
beside it as with ``csv``: scripts that read metrics.csv read it whichever store the run
also logs to.

Every logger numbers its rows by optimizer steps done (``trainer.global_step``), as the
checkpoints, summary.json, the target's history and Optuna's intermediate values do: the
validation after 13 optimizer steps is step 13 everywhere. Lightning's own loggers number
by ``_batches_that_stepped``, which at a validation, and at a step's metrics, does not count
that step yet (12), and so does each ``log_every_n_steps`` row (49 for 50 steps done);
:func:`log_at_optimizer_steps` gives them the trainer's count instead.
"""

from __future__ import annotations

import importlib.util

from omegaconf import OmegaConf
from omegaconf.errors import InterpolationResolutionError

from tuneup import TuneupError, hookimpl
from tuneup.trainer.validation import OneOf, problems

from .held import Held, HeldMetricsFile, HeldTensorBoardLogger, HeldWandbLogger
from .mlflow_resume import drop_values_after
from .mlflow_run import (
    build_mlflow_logger,
    flat_params,
    log_params,
    log_run_end,
    mlflow_problems,
    mlflow_store,
    summary_metrics,
)

__all__ = ["Plugin", "build_logger", "log_at_optimizer_steps", "summary_metrics"]

NEEDS = {
    "csv": (),
    "tensorboard": ("tensorboard", "tensorboardX"),
    "wandb": ("wandb",),
    "mlflow": ("mlflow",),
}


def build_logger(settings, save_dir: str):
    """The Lightning logger named by ``settings.name``, writing under ``save_dir``
    (``mlflow``: the CSV logger and the MLflow one), held until the run is accepted
    (:mod:`.held`: a refused resume writes nothing into the run it refused)."""
    if settings.name == "mlflow":
        return [
            build_logger(OmegaConf.create({"name": "csv"}), save_dir),
            build_mlflow_logger(settings, save_dir),
        ]
    if settings.name == "csv":
        return HeldMetricsFile(save_dir)
    if settings.name == "tensorboard":
        return HeldTensorBoardLogger(save_dir=save_dir, name="", version="")
    return HeldWandbLogger(
        save_dir=save_dir,
        project=settings.get("project", "tuneup"),
        name=settings.get("run_name"),
        offline=settings.get("offline", True),
    )


def log_at_optimizer_steps(logger, trainer) -> None:
    """Make ``logger`` log the rows Lightning numbers (``_batches_that_stepped``) at
    ``trainer.global_step``, the optimizer steps done when the values were measured. A step
    that anything else passes (a plugin's own ``logger.log_metrics(..., step=n)``) is kept."""
    log_metrics = logger.log_metrics

    def at_optimizer_step(metrics, step=None):
        if step is not None and step == trainer.fit_loop.epoch_loop._batches_that_stepped:
            step = trainer.global_step
        return log_metrics(metrics, step)

    logger.log_metrics = at_optimizer_step


def is_fit(cfg) -> bool:
    """A training run (not ``mode=validate|test|predict``, which log their metrics alone)."""
    return cfg.get("mode", "fit") == "fit"


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
            self.logger = self.logger[-1]  # the MLflow one (metrics.csv's is Lightning's alone)
            self.store = mlflow_store(cfg.logger, kwargs["default_root_dir"])[0]

    @hookimpl
    def on_fit_start(self, cfg, trainer):
        for logger in trainer.loggers:  # before anything is logged
            log_at_optimizer_steps(logger, trainer)

    @hookimpl
    def on_run_accepted(self, cfg, trainer):
        """The loggers' first records: nothing was written before (a refused resume)."""
        for logger in trainer.loggers:
            if isinstance(logger, Held):
                logger.accept()
        if cfg.logger.name == "mlflow" and trainer.is_global_zero and is_fit(cfg):
            # A resumed session goes on from the checkpoint's step, restored by now: what an
            # earlier session logged past it is trained again (mlflow_resume.drop_values_after).
            drop_values_after(self.logger, trainer.global_step, self.store)
            log_params(self.logger, flat_params(cfg))

    @hookimpl(wrapper=True)  # around the others: their figures are in the summary after yield
    def report(self, cfg, summary):
        result = yield
        if cfg.logger.name != "mlflow" or self.logger is None:
            return result
        try:
            # A run that failed before training in a directory of its own (the report runs only
            # where the run owns its directory, never for a refused resume): its MLflow run
            # records the failure, as its summary.json does.
            self.logger.accept()
            log_run_end(self.logger, summary)
        except Exception as exc:  # the store went away: the run itself is done and kept
            raise TuneupError(
                f"logger=mlflow: the run's end was not logged to {self.store}: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        return result
