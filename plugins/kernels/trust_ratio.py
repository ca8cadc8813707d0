"""What LAMB and LARS share: a step that scales each tensor's update by a per-layer trust
ratio, run either one tensor at a time (the reference) or as multi-tensor Triton launches.

A subclass names its op (``OP_NAME``), creates each parameter's state (``_state``) and gives
the two step functions, both ``step(group, params, states, grad_scale, found_inf)``.

``step()`` sets no attribute of the optimizer, so ``torch.compile`` can trace it: Dynamo
rejects (torch 2.11) or silently drops (torch 2.13) an attribute set inside a compiled step.
What a step runs is fixed when the optimizer is made (``implementation``). The fused step is
not traced at all: its kernels reach the tensors through a table of raw addresses, which a
compiler cannot see, and it is already a few multi-tensor launches.
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

    @property
    def implementation(self) -> str:
        """What every step runs: "triton" (fused, or it raises) or "reference"."""
        return TRITON if self.fused else REFERENCE

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
            triton_support.record(self.OP_NAME, self.implementation)
            states = [self._state(p) for p in params]
            if self.fused:
                _untraced(type(self).step_triton, group, params, states, grad_scale, found_inf)
            else:
                type(self).step_reference(group, params, states, grad_scale, found_inf)
        return loss

    def _state(self, param: Tensor):
        raise NotImplementedError


@torch.compiler.disable
def _untraced(step_group: Callable, *args) -> None:
    """Run the fused step eagerly, also inside a compiled step (a graph break, see above)."""
    step_group(*args)
