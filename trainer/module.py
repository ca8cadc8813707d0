"""The LightningModule that trains any classifier or language model the config builds.

Loss is cross-entropy over the last dimension (images: [B, C]; tokens:
[B, T, V]) computed in fp32. Plugins reach the loop through the bridge
callback; this module only forwards ``transform_batch`` (after the device
transfer) and asks the ``configure_optimizer`` hook before building the
optimizer named in the config.

For checkpoints it adds what exact resume needs beyond Lightning's own state:
every rank's RNG states (restored when training starts, after everything that
runs between loading and the first batch) and the run's settings
(trainer/resume.py). A NaN/inf loss stops the run (trainer/divergence.py), and
a checkpoint is never written with non-finite weights.
"""

from __future__ import annotations

import warnings

import pytorch_lightning as pl
import torch
from torch.nn import functional as F

from trainer import rng
from trainer.divergence import Diverged, LossWatch, nonfinite_tensors
from trainer.optim import build_optimizer, build_scheduler
from trainer.resume import ORDER_KEY, RNG_KEY, RUN_KEY, run_facts
from trainer.sampling import data_order, restore_data_order

# We transform batches in the module on purpose (plugins' transform_batch), whatever the data.
warnings.filterwarnings("ignore", message=r".*overridden `on_after_batch_transfer`")


def cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, -2).float(), target.flatten())


def defer_loss_check(loss, trainer) -> bool:
    """Whether the NaN/inf loss check waits for the logging interval (see LossWatch).

    On one CPU process reading the loss costs nothing, so a bad step stops at once; on CUDA
    it would drain the device queue every step, and across processes the ranks must agree.
    """
    return loss.device.type == "cuda" or trainer.world_size > 1


def _identity(output):
    return output


class TrainingModule(pl.LightningModule):
    def __init__(self, cfg, model: torch.nn.Module, plugins) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = model
        self.plugins = plugins
        # What the model's output becomes: a loss, and logits for accuracy. A kernels plugin
        # may swap both (e.g. a fused head + loss whose model output is the hidden states).
        self.loss_fn = cross_entropy
        self.logits_fn = _identity
        self._transforms = bool(plugins.call_order("transform_batch"))
        self.loss_watch = LossWatch()
        self.validated_at_step: int | None = None  # the runner validates at the end if stale
        self._resumed_rng: dict | None = None
        self._resumed_order: dict | None = None

    def forward(self, x):
        return self.model(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = self.loss_fn(self.model(x), y)
        step, epoch = self.trainer.global_step + 1, self.trainer.current_epoch
        deferred = defer_loss_check(loss, self.trainer)
        self.loss_watch.observe(loss, step, epoch, batch_idx, self.global_rank, deferred)
        # Lightning writes step metrics only every log_every_n_steps, but self.log's bookkeeping
        # costs ~0.5 ms on every call: call it only when the value will be written. Not
        # prog_bar: Lightning would .item() (sync) it every step.
        if self.trainer._logger_connector.should_update_logs:
            self.log("train/loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        output = self.model(x)
        loss = self.loss_fn(output, y)
        acc = (self.logits_fn(output).argmax(-1) == y).float().mean()
        self.log("val/loss", loss, sync_dist=True, prog_bar=True)
        self.log("val/acc", acc, sync_dist=True, prog_bar=True)

    def on_validation_end(self):
        if not self.trainer.sanity_checking:
            self.validated_at_step = self.trainer.global_step

    def on_after_batch_transfer(self, batch, dataloader_idx):
        if self._transforms:
            batch = self.plugins.pipeline("transform_batch", "batch", batch, cfg=self.cfg)
        return batch

    def configure_optimizers(self):
        params = [p for p in self.model.parameters() if p.requires_grad]
        optimizer = self.plugins.call(
            "configure_optimizer", cfg=self.cfg, params=params, trainer=self.trainer
        )
        if optimizer is None:
            optimizer = build_optimizer(self.cfg, params)
        total = max(1, int(self.trainer.estimated_stepping_batches))
        scheduler = build_scheduler(self.cfg, optimizer, total)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
        }

    def on_train_batch_end(self, outputs, batch, batch_idx):
        if (batch_idx + 1) % self.trainer.log_every_n_steps == 0:
            self._check_loss()  # CUDA: one sync per logging interval, as logging itself

    def _check_loss(self) -> None:
        strategy = self.trainer.strategy
        self.loss_watch.check(lambda bad: strategy.reduce_boolean_decision(bad, all=False))

    def on_save_checkpoint(self, checkpoint):
        self._check_loss()
        bad = nonfinite_tensors(checkpoint["state_dict"])
        if bad:
            raise Diverged(
                f"not saving step {self.trainer.global_step}: weights {', '.join(bad[:5])} hold "
                "NaN or inf; the checkpoints written before are kept"
            )
        checkpoint[RNG_KEY] = rng.capture_all_ranks()
        checkpoint[ORDER_KEY] = data_order(self.trainer)
        checkpoint[RUN_KEY] = run_facts(self.cfg, self.trainer, checkpoint[ORDER_KEY])

    def on_load_checkpoint(self, checkpoint):
        self._resumed_rng = rng.for_rank(checkpoint.get(RNG_KEY), self.global_rank)
        self._resumed_order = checkpoint.get(ORDER_KEY)

    def on_train_end(self):
        self._check_loss()  # the last steps' losses, also when no checkpoint follows

    def on_train_start(self):
        # Restored here, not on load: whatever runs between loading and the first batch
        # (setup, dataloaders, a sanity check) must not shift the resumed random stream,
        # and the training DataLoader exists only now (trainer/sampling.py).
        restore_data_order(self.trainer, self._resumed_order)
        if self._resumed_rng is not None:
            rng.restore(self._resumed_rng)
        self._resumed_rng = self._resumed_order = None
