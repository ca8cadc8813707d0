"""The LightningModule that trains any classifier or language model the config builds.

Loss is cross-entropy over the last dimension (images: [B, C]; tokens:
[B, T, V]) computed in fp32. Plugins reach the loop through the bridge
callback; this module only forwards ``transform_batch`` (after the device
transfer) and asks the ``configure_optimizer`` hook before building the
optimizer named in the config.
"""

from __future__ import annotations

import warnings

import pytorch_lightning as pl
import torch
from torch.nn import functional as F

from trainer.optim import build_optimizer, build_scheduler

# We transform batches in the module on purpose (plugins' transform_batch), whatever the data.
warnings.filterwarnings("ignore", message=r".*overridden `on_after_batch_transfer`")


def cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, -2).float(), target.flatten())


class TrainingModule(pl.LightningModule):
    def __init__(self, cfg, model: torch.nn.Module, plugins) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = model
        self.plugins = plugins
        self.loss_fn = cross_entropy  # a kernels plugin may swap in a fused loss
        self._transforms = bool(plugins.call_order("transform_batch"))

    def forward(self, x):
        return self.model(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = self.loss_fn(self.model(x), y)
        self.log("train/loss", loss)  # not prog_bar: Lightning would .item() it every step
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self.model(x)
        loss = self.loss_fn(logits, y)
        acc = (logits.argmax(-1) == y).float().mean()
        self.log("val/loss", loss, sync_dist=True, prog_bar=True)
        self.log("val/acc", acc, sync_dist=True, prog_bar=True)

    def on_after_batch_transfer(self, batch, dataloader_idx):
        if self._transforms:
            batch = self.plugins.pipeline("transform_batch", "batch", batch, cfg=self.cfg)
        return batch

    def configure_optimizers(self):
        params = [p for p in self.model.parameters() if p.requires_grad]
        optimizer = self.plugins.call("configure_optimizer", cfg=self.cfg, params=params)
        if optimizer is None:
            optimizer = build_optimizer(self.cfg, params)
        total = max(1, int(self.trainer.estimated_stepping_batches))
        scheduler = build_scheduler(self.cfg, optimizer, total)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
        }
