"""train_loss and loss_curve: the training loss as the summary reports it.

Losses stay on their device, kept by reference: the current and the last optimizer step's
micro-batch losses, and the loss curve's buckets (:class:`LossCurve`). Nothing is read back
per step; at the fit's end one all-reduce makes both figures means over the data-parallel
processes (the global batch's loss), and the report reads them once. Kept apart from the
plugin (plugins/measure/), whose hooks time the steps, as the one owner of the loss tensors.
"""

from __future__ import annotations

import torch

from tuneup.plugins.measure.loss_curve import LossCurve
from tuneup.trainer.state.data_order import data_group


class TrainLoss:
    """The last optimizer step's loss (the mean over its micro-batches) and the loss curve."""

    def __init__(self, points: int) -> None:
        self.curve = LossCurve(points)
        self.window: list = []  # the current optimizer step's micro-batch losses so far
        self.last_step: list = []  # the last finished step's
        self.last = None  # their mean, taken at the fit's end

    def add(self, trainer, outputs, samples: int) -> None:
        """A training micro-batch's loss (from ``training_step``'s outputs), if it gave one."""
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if loss is None:
            return
        loss = loss.detach()
        if trainer.accumulate_grad_batches != 1:  # Lightning hands over loss / k: undo that
            loss = loss * trainer.accumulate_grad_batches
        self.window.append(loss)  # by reference: the step's mean is taken at the end
        if not trainer.fit_loop._should_accumulate():  # the step's last micro-batch
            self.last_step, self.window = self.window, []
        self.curve.add(loss, samples)

    def average_over_processes(self, trainer) -> None:
        """The loss curve and the last loss as means over the data-parallel processes (each
        process's batches have the same size, so the mean of their means is the global
        batch's): one all-reduce, at the fit's end, which every process reaches; nothing per
        step. A run ended by a failure or a signal keeps this process's own."""
        self.last = self.step_loss()
        if trainer.world_size == 1 or self.last is None:
            return
        curve = self.curve.flushed()
        parts = [self.last.float().reshape(1), *([] if curve is None else [curve])]
        packed = trainer.strategy.reduce(
            torch.cat(parts), group=data_group(trainer), reduce_op="mean"
        )
        self.last = packed[0]
        if curve is not None:
            self.curve.sums = packed[1:]

    def step_loss(self):
        """This process's loss of the last step (of the micro-batches so far, if it stopped
        inside one), or None before any."""
        losses = self.last_step or self.window
        return torch.stack(losses).float().mean() if losses else None

    def value(self) -> float | None:
        """train_loss: the mean over the processes where the fit ended, else this process's."""
        loss = self.last if self.last is not None else self.step_loss()
        return None if loss is None else float(loss)
