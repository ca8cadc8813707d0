"""Experiment logger, chosen by ``logger=csv|tensorboard|wandb``; files go under the run directory.

``csv`` needs nothing beyond Lightning; ``tensorboard`` needs ``tensorboard`` or
``tensorboardX`` (extra ``tuneup[tensorboard]``); ``wandb`` needs ``wandb``
(extra ``tuneup[wandb]``) and runs offline unless ``logger.offline=false``.
"""

from __future__ import annotations

import importlib.util

from trainer import hookimpl
from trainer.validation import OneOf, problems

NEEDS = {"csv": (), "tensorboard": ("tensorboard", "tensorboardX"), "wandb": ("wandb",)}


def build_logger(settings, save_dir: str):
    """The Lightning logger named by ``settings.name``, writing under ``save_dir``."""
    from pytorch_lightning import loggers

    if settings.name == "csv":
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
