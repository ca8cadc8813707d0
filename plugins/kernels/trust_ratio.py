"""What LAMB and LARS share: a step that scales each tensor's update by a per-layer trust
ratio, run either one tensor at a time (the reference) or as multi-tensor Triton launches.

A subclass names its op (``OP_NAME``), creates each parameter's state (``_state``) and gives
the two step functions, both ``step(group, params, states, grad_scale, found_inf)``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import torch
from torch import Tensor

from . import triton_support
from .triton_support import REFERENCE, TRITON


def is_excluded(group: dict, param: Tensor) -> bool:
    """Biases and norm scales (ndim <= 1): no weight decay, trust ratio 1."""
    return group["exclude_norms_and_biases"] and param.ndim <= 1


class TrustRatioOptimizer(torch.optim.Optimizer):
    OP_NAME: ClassVar[str]
    step_reference: ClassVar[Callable]
    step_triton: ClassVar[Callable]

    def __init__(self, params, defaults: dict, fused: bool) -> None:
        super().__init__(params, defaults)
        self.fused = fused
        # Tells GradScaler to hand over grad_scale/found_inf instead of unscaling; as for
        # torch's fused Adam, only when fused (Lightning forbids clipping such optimizers).
        self._step_supports_amp_scaling = fused
        self.implementation: str | None = None

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        grad_scale = getattr(self, "grad_scale", None)
        found_inf = getattr(self, "found_inf", None)
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            if self.fused:
                triton_support.require_triton(
                    params[0].device, f"{type(self).__name__}(fused=True)"
                )
            self.implementation = TRITON if self.fused else REFERENCE
            triton_support.record(self.OP_NAME, self.implementation)
            states = [self._state(p) for p in params]
            step_group = type(self).step_triton if self.fused else type(self).step_reference
            step_group(group, params, states, grad_scale, found_inf)
        return loss

    def _state(self, param: Tensor):
        raise NotImplementedError
