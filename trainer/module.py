"""The LightningModules a run trains.

:class:`TrainingModule` trains any ``nn.Module`` the config builds (a zoo model or the
user's ``model._target_``): the task (trainer/task.py) turns the model's output into the
loss, in fp32, and the validation metrics. Plugins reach the loop through the bridge
callback; :func:`with_batch_transforms` gives it the plugins' ``transform_batch`` (after
the device transfer) where a plugin has one, and it asks the ``configure_optimizer`` hook before building the optimizer named in the config. A
kernels plugin may swap ``loss_fn`` and ``logits_fn`` (e.g. a fused head + loss whose
model output is the hidden states).

A user's own ``LightningModule`` (``model=lightning``) is trained as it is: its
``training_step`` and ``configure_optimizers`` run unchanged; :func:`with_batch_transforms`
gives it the plugins' ``transform_batch`` (e.g. channels_last inputs) after its own
``on_after_batch_transfer``.

Run state (RNG, data order, divergence) is the run-state callback's, for both
(trainer/state/run_state.py).
"""

from __future__ import annotations

import math
import warnings

import pytorch_lightning as pl
import torch

from tuneup.trainer import task as tasks
from tuneup.trainer.bridge import skip_no_op_hooks
from tuneup.trainer.clip import GradNorm, clip_grad_norm_
from tuneup.trainer.optim import build_optimizer, build_scheduler
from tuneup.trainer.state.data_order import data_group

# We transform batches in the module on purpose (plugins' transform_batch), whatever the data.
warnings.filterwarnings("ignore", message=r".*overridden `on_after_batch_transfer`")


def _identity(output):
    return output


class TrainingModule(pl.LightningModule):
    def __init__(self, cfg, model: torch.nn.Module, plugins, task: tasks.Task, run_state) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = model
        self.plugins = plugins
        self.task = task
        self.run_state = run_state  # observes each loss before its backward
        self.loss_fn = task.loss_fn
        self.logits_fn = _identity
        self.clip = cfg.optimizer.get("clip_grad_norm")
        self.grad_norm = GradNorm()
        self._window: list = []  # losses of a logged step's micro-batches so far
        #: False where a plugin cuts each batch into chunks and logs the batch's loss itself
        #: (grad_accum.micro_batch_size): a chunk's log would be an all-reduce in the middle of
        #: chunks that one process may retry alone (out of memory)
        self.logs_each_batch = True
        skip_no_op_hooks(self, pl.LightningModule)  # plugins hook the loop through the bridge

    def forward(self, x):
        return tasks.forward(self.model, x)

    def configure_model(self):
        """Nothing here: a model-parallel strategy (``strategy=fsdp``) parallelises ``self.model``
        itself when it sets up (plugins/strategy/parallelize.py). Defined because Lightning's
        ModelParallelStrategy asks for it."""

    def compute(self, batch):
        """(loss, output) of one batch under the task."""
        if self.task.model_loss:
            output = tasks.call_model(self.model, batch)
            return tasks.returned_loss(output), None
        x, y = batch
        output = tasks.logits_of(tasks.forward(self.model, x))  # a transformers output: .logits
        return self.loss_fn(output, y), output

    def training_step(self, batch, batch_idx):
        loss, _ = self.compute(batch)
        self.run_state.observe(loss, self.trainer, batch_idx, batch)
        if self.logs_each_batch:
            self.log_loss(loss)
        return loss

    def log_loss(self, loss) -> None:
        """``train/loss`` of a step that is logged: the mean over its micro-batches and over the
        data-parallel processes, the global batch's loss (each process's batches have the same
        size: the training loaders make full batches only).

        Lightning writes step metrics only every ``log_every_n_steps``, but ``self.log``'s
        bookkeeping costs ~0.5 ms on every call, and its ``sync_dist`` all-reduce would wait
        for every device: both happen only at the last micro-batch of a logged step, which is
        the same one on every process. Not prog_bar: Lightning would .item() (sync) it every
        step."""
        trainer = self.trainer
        if not trainer._logger_connector.should_update_logs:
            return
        self._window.append(loss.detach())
        if trainer.fit_loop._should_accumulate():
            return
        mean = torch.stack(self._window).mean() if len(self._window) > 1 else self._window[0]
        self._window = []
        self.log(
            "train/loss",
            mean,
            sync_dist=trainer.world_size > 1,
            sync_dist_group=data_group(trainer),
        )

    def validation_step(self, batch, batch_idx):
        self.evaluate(batch, "val")

    def test_step(self, batch, batch_idx):
        """``mode=test``: the validation step's loss and metrics, on the test split."""
        self.evaluate(batch, "test")

    def evaluate(self, batch, split: str) -> None:
        loss, output = self.compute(batch)
        self.log(f"{split}/loss", loss, sync_dist=True, prog_bar=True)
        if output is not None:
            acc = self.task.accuracy(self.logits_fn(output), batch[1])
            self.log(f"{split}/acc", acc, sync_dist=True, prog_bar=True)

    def predict_step(self, batch, batch_idx):
        """``mode=predict``: the model's output for the batch's inputs (the logits; with
        task=model_loss, what the model returns for the whole batch, its logits if it has)."""
        if self.task.model_loss:
            return tasks.logits_of(tasks.call_model(self.model, batch))
        x = batch[0] if isinstance(batch, (tuple, list)) else batch
        return self.logits_fn(tasks.logits_of(tasks.forward(self.model, x)))

    def configure_gradient_clipping(
        self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None
    ):
        """``optimizer.clip_grad_norm``: every step, across meshes (trainer/clip.py). The norm
        goes to metrics.csv at logging steps, measured there when nothing is clipped."""
        logging = self.trainer._logger_connector.should_update_logs
        if self.clip is not None or logging:
            norm = clip_grad_norm_(self.model.parameters(), self.clip)
            self.grad_norm.add(norm, self.clip)
            if logging:
                self.log("train/grad_norm", norm)
        super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)

    def configure_optimizers(self):
        params = [p for p in self.model.parameters() if p.requires_grad]
        params = self.plugins.pipeline(
            "configure_param_groups", "params", params, cfg=self.cfg, model=self.model
        )
        optimizer = self.plugins.call(
            "configure_optimizer", cfg=self.cfg, params=params, trainer=self.trainer
        )
        if optimizer is None:
            optimizer = build_optimizer(self.cfg, params)
        total = self.trainer.estimated_stepping_batches  # inf: no limit (scheduler=constant)
        total = max(1, int(total)) if math.isfinite(total) else 1
        scheduler = build_scheduler(self.cfg, optimizer, total)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
        }


def with_batch_transforms(module: pl.LightningModule, plugins, cfg) -> pl.LightningModule:
    """Give a LightningModule (a user's, or TrainingModule) the plugins' ``transform_batch``
    pipeline, in place.

    Lightning has no callback between the device transfer and ``training_step``, so the
    module's own ``on_after_batch_transfer`` is wrapped on the instance: it runs first,
    then the pipeline. Nothing is wrapped when no plugin transforms batches.
    """
    if not plugins.call_order("transform_batch"):
        return module
    own = module.on_after_batch_transfer

    def on_after_batch_transfer(batch, dataloader_idx):
        batch = own(batch, dataloader_idx)
        return plugins.pipeline("transform_batch", "batch", batch, cfg=cfg)

    module.on_after_batch_transfer = on_after_batch_transfer
    return module
