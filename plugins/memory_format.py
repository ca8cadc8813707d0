"""Memory format, chosen by ``memory_format=contiguous|channels_last``: how 4-D tensors are laid out.

Convolutions on tensor cores (fp16, bf16 or tf32 on Volta and later) run NHWC
kernels; a model kept in the default NCHW ("contiguous") layout makes cuDNN
transpose around every convolution. ``channels_last`` converts the model's 4-D
parameters and buffers once, and every 4-D tensor of a batch after its device
transfer, so convolutions get NHWC on both sides. Only strides change, never
values: outputs equal the contiguous model's within fp32 rounding.

``memory_format=contiguous`` (the default) registers no plugin at all.

A model without ``nn.Conv2d`` takes no 4-D input whose layout matters (``model=mlp``
flattens the image first), so asking for channels_last there is a ``check`` error
rather than a silent no-op.

Order in ``configure_model``: unflagged, so after kernel swaps (``tryfirst``) and
before ``torch.compile`` (``trylast``). Between this plugin and activation
checkpointing pluggy's order would be registration (config) order, so they are
built to commute instead: checkpointing wraps each block's ``forward`` in place,
without new parameters or modules, and ``Module.to(memory_format=...)`` converts
the parameters wherever they live, so either order gives the same model (tested
in tests/test_activation_checkpointing.py).
"""

from __future__ import annotations

import torch
from torch import nn

from tuneup import TuneupError, hookimpl
from tuneup.trainer.validation import OneOf, problems


def apply_channels_last(model: nn.Module) -> nn.Module:
    """Convert the model's 4-D parameters and buffers to channels_last, in place; returns it."""
    return model.to(memory_format=torch.channels_last)


def batch_to_channels_last(batch):
    """``batch`` with every 4-D tensor in channels_last; other tensors and containers as they are."""
    if isinstance(batch, torch.Tensor):
        return batch.contiguous(memory_format=torch.channels_last) if batch.dim() == 4 else batch
    if isinstance(batch, (list, tuple)):
        return type(batch)(batch_to_channels_last(item) for item in batch)
    if isinstance(batch, dict):
        return {key: batch_to_channels_last(value) for key, value in batch.items()}
    return batch


def no_4d_input_reason(model: nn.Module, model_name: str) -> str | None:
    """Why channels_last cannot help ``model`` (it has no 2-D convolution), or None if it can."""
    if any(isinstance(m, nn.Conv2d) for m in model.modules()):
        return None
    classes = sorted({type(m).__name__ for m in model.modules()})
    return (
        f"memory_format=channels_last needs a model that takes 4-D (N, C, H, W) input, but "
        f"model={model_name} has no 2-D convolution (its layers: {', '.join(classes)}), so no "
        "layer reads the 4-D layout and channels_last would change nothing; use "
        "memory_format=contiguous, or a convolutional model such as model=small_resnet"
    )


class Plugin:
    def __init__(self) -> None:
        self.converted: int | None = None  # 4-D parameters and buffers converted, once built
        self.model_name = "the model"

    @hookimpl
    def check(self, cfg, plan):
        found = problems(cfg, {"memory_format.name": OneOf(("channels_last",))})
        self.model_name = plan.model_name
        if not plan.sound:
            return found  # the core reports the model's or the data's problems
        model, shape = plan.meta_model(), plan.input_shape
        if model is None or shape is None:
            return found  # configure_model checks the real model
        if len(shape) != 3:
            found.append(
                f"memory_format=channels_last needs 4-D (N, C, H, W) input, but data "
                f"{plan.data_name} gives samples of shape {list(shape)}; use "
                "memory_format=contiguous"
            )
        elif reason := no_4d_input_reason(model, plan.model_name):
            found.append(reason)
        return found

    @hookimpl
    def configure_model(self, cfg, model):
        reason = no_4d_input_reason(model, self.model_name)
        if reason:
            raise TuneupError(reason)
        model = apply_channels_last(model)
        self.converted = sum(t.dim() == 4 for t in [*model.parameters(), *model.buffers()])
        return model

    @hookimpl
    def transform_batch(self, batch):
        return batch_to_channels_last(batch)

    def describe(self):
        settings = {"name": "channels_last"}
        if self.converted is not None:
            settings["converted_4d_tensors"] = self.converted
        return settings
