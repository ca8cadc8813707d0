"""Experiment logger, chosen by ``logger=csv|tensorboard|wandb``; files go under the run directory.

``csv`` needs nothing beyond Lightning (a resumed run keeps the earlier
rows: ``metrics-1.csv``, ``metrics-2.csv``... in the order they were written); ``tensorboard`` needs ``tensorboard`` or
``tensorboardX`` (extra ``tuneup[tensorboard]``); ``wandb`` needs ``wandb``
(extra ``tuneup[wandb]``) and runs offline unless ``logger.offline=false``.
"""

from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path

from tuneup import hookimpl
from tuneup.trainer.validation import OneOf, problems

NEEDS = {"csv": (), "tensorboard": ("tensorboard", "tensorboardX"), "wandb": ("wandb",)}


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
        return loggers.CSVLogger(save_dir=save_dir, name="", version="")
    if settings.name == "tensorboard":
        return loggers.TensorBoardLogger(save_dir=save_dir, name="", version="")
    return loggers.WandbLogger(
        save_dir=save_dir,
        project=settings.get("project", "tuneup"),
        name=settings.get("run_name"),
        offline=settings.get("offline", True),
    )


class Plugin:
    @hookimpl
    def check(self, cfg):
        found = problems(cfg, {"logger.name": OneOf(tuple(NEEDS))})
        needs = NEEDS.get(cfg.logger.name, ())
        if needs and not any(importlib.util.find_spec(m) for m in needs):
            found.append(
                f"logger={cfg.logger.name} needs the '{needs[0]}' package, which is not installed: "
                f"pip install 'tuneup[{cfg.logger.name}]', or choose logger=csv"
            )
        return found

    @hookimpl
    def configure_trainer(self, cfg, kwargs):
        kwargs["logger"] = build_logger(cfg.logger, kwargs["default_root_dir"])
