"""What one run trains with: the model through the plugins' ``configure_model`` pipeline, the
LightningModule around it, and the Lightning Trainer with its arguments (the config's
``trainer`` node, the core's callbacks, the plugins' ``configure_trainer``).

The runner (runner.py) calls :func:`build` once its checks pass; the benchmarks call it to time
a run's steps without the runner's directory and summary.
"""

from __future__ import annotations

import sys
from contextlib import nullcontext
from pathlib import Path

import pytorch_lightning as pl

from tuneup.trainer import callbacks
from tuneup.trainer.bridge import Bridge
from tuneup.trainer.components import Plan
from tuneup.trainer.empty_init import empty_parameters
from tuneup.trainer.module import TrainingModule, with_batch_transforms
from tuneup.trainer.plugin_manager import PluginManager
from tuneup.trainer.state.run_state import RunState


def build(cfg, plugins: PluginManager, plan: Plan, run_dir: Path, empty: bool = False):
    """Seed, build data and model, let plugins transform them, and create the Trainer.

    ``empty``: the model's parameters on the meta device (trainer/empty_init.py); the strategy
    materialises and initialises them once sharded (``strategy.init``).
    Returns (trainer, the LightningModule, the data module, the run-state callback).
    """
    data = plan.data
    pl.seed_everything(cfg.seed, workers=True, verbose=False)  # the model's initial weights
    with empty_parameters() if empty else nullcontext():
        model = plan.build_model()
    model = plugins.pipeline("configure_model", "model", model, cfg=cfg)
    run_state = RunState(cfg, watches_outputs=plan.lightning, owns_optimizer=not plan.lightning)
    if not plan.lightning:
        model = TrainingModule(cfg, model, plugins, plan.task, run_state)
    # the pipeline only where a plugin transforms batches: an overridden on_after_batch_transfer
    # costs Lightning's dispatch (and a warning-cache lookup) on every batch
    module = with_batch_transforms(model, plugins, cfg)
    kwargs = trainer_kwargs(cfg, plugins, run_dir)
    plugins.call("configure_trainer", cfg=cfg, kwargs=kwargs)
    kwargs["callbacks"].append(run_state)  # after the plugins' callbacks: it restores the RNG
    return pl.Trainer(**kwargs), module, data, run_state


def trainer_kwargs(cfg, plugins: PluginManager, run_dir: Path) -> dict:
    from omegaconf import OmegaConf

    kwargs = OmegaConf.to_container(cfg.trainer, resolve=True)
    kwargs["default_root_dir"] = str(run_dir)
    if kwargs.get("enable_progress_bar") == "auto":  # a bar where someone watches it, not in logs
        kwargs["enable_progress_bar"] = sys.stderr.isatty()
    kwargs["callbacks"] = [Bridge(cfg, plugins), *callbacks.build(cfg)]  # the user's: config
    if kwargs.get("log_every_n_steps") is None:  # null: fitted to the run once its length is known
        kwargs["log_every_n_steps"] = 1  # until then: no "smaller than the logging interval"
        kwargs["callbacks"].append(LogInterval())
    # The data module's sampler shards each epoch by rank itself (state/data_order.py): Lightning must
    # not wrap it in a DistributedSampler, which would shard the shard again.
    kwargs["use_distributed_sampler"] = False
    return kwargs


class LogInterval(pl.Callback):
    """``trainer.log_every_n_steps=null``: every 20 optimizer steps, fewer in a short run (at
    least about 10 points in metrics.csv) or a short epoch (Lightning would warn that the
    epoch is shorter than the interval). Set when training starts: the epoch's length is
    known only once Lightning has made the training DataLoader."""

    def on_train_start(self, trainer, pl_module) -> None:
        trainer.log_every_n_steps = log_interval(
            trainer.num_training_batches,
            trainer.accumulate_grad_batches,
            trainer.max_steps,
            trainer.max_epochs,
        )
        # Its one event is done: out of the list, Lightning does not dispatch its hooks each
        # step to it (bench/overhead.py). A new list: the one being iterated now stays as it is.
        trainer.callbacks = [c for c in trainer.callbacks if c is not self]


def log_interval(batches, accumulate: int, max_steps: int, max_epochs, most: int = 20) -> int:
    """Optimizer steps between logged points: at most ``most``, at most an epoch's steps, and
    a tenth of the run's steps where it is short."""
    per_epoch = max(1, int(batches) // max(1, accumulate)) if batches != float("inf") else most
    if max_steps is not None and max_steps > 0:
        total = max_steps
    elif max_epochs is not None and max_epochs > 0:
        total = per_epoch * max_epochs
    else:
        total = most * 10
    return max(1, min(most, per_epoch, total // 10))
