"""Test-time augmentation at validation, chosen by ``tta=flip``.

Each validation batch of images runs through the model twice, as it is and flipped left to
right, and the logits are their mean (FFCV's and airbench's evaluation): ``val/acc`` and
``val/loss`` are the flip-averaged model's. Training is unchanged. It pays where the training
data are flipped too (the model learnt both orientations) and validation is a small part
of the run's time: it doubles validation's forward passes.

The two forwards are a forward hook on the network (:func:`flip_averaged`), in place only
between ``on_validation_start`` and ``on_validation_end``; 4-D image inputs ``[B, C, H, W]``
only (a check error otherwise), in either memory format: ``flip(-1)`` is the width.
"""

from __future__ import annotations

import torch

from tuneup import TuneupError, hookimpl


def flip_average(model, x: torch.Tensor) -> torch.Tensor:
    """The mean of ``model(x)`` and ``model(x flipped left to right)``: the plain function."""
    return (model(x) + model(x.flip(-1))) / 2


class FlipHook:
    """A forward hook that returns the flip-averaged output of its module; it calls the module
    again on the flipped input, and does nothing inside that second call."""

    def __init__(self) -> None:
        self.inside = False

    @torch.compiler.disable  # under compile=on: run eagerly, the two forwards stay compiled
    def __call__(self, module, args, output):
        if self.inside:
            return None
        (x,) = args
        if not isinstance(output, torch.Tensor) or x.dim() != 4:
            raise TuneupError(
                f"tta=flip averages the logits of images [B, C, H, W]; this "
                f"validation's input has shape {list(x.shape)} and the model "
                f"returns {type(output).__name__}: use tta=off"
            )
        self.inside = True
        try:
            return (output + module(x.flip(-1))) / 2
        finally:
            self.inside = False


def problems_with(plan) -> list[str]:
    if plan is None:
        return []
    if plan.lightning:
        return [
            f"tta=flip cannot apply to model=lightning: the LightningModule {plan.model_name} "
            "runs its own validation_step; average flipped logits there, or use tta=off"
        ]
    if not plan.sound:
        return []
    shape = plan.input_shape
    if plan.inputs != "images" or shape is None or len(shape) != 3:
        return [
            f"tta=flip flips images left to right, but data {plan.data_name} gives "
            f"{plan.inputs or 'other'} inputs of shape {list(shape or [])} per sample "
            "(expected [C, H, W] images); use tta=off"
        ]
    if plan.task.model_loss:
        return [
            "tta=flip averages logits, but with task=model_loss the model returns its loss; "
            "use tta=off"
        ]
    return []


class Plugin:
    def __init__(self) -> None:
        self.handle = None

    @hookimpl
    def check(self, plan):
        return problems_with(plan)

    @hookimpl
    def on_validation_start(self, module):
        if self.handle is None:
            self.handle = module.model.register_forward_hook(FlipHook())

    @hookimpl
    def on_validation_end(self):
        self._remove()

    @hookimpl
    def on_exception(self):
        self._remove()

    def _remove(self) -> None:
        if self.handle is not None:
            self.handle.remove()
            self.handle = None

    def describe(self):
        return {"name": "flip", "at": "validation: mean logits of x and x.flip(-1)"}
