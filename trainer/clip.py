"""Gradient clipping by total norm (``optimizer.clip_grad_norm=X``) on any layout, and the
gradient norm's figures (``train/grad_norm`` in metrics.csv, ``grad_norm`` in summary.json).

``torch.nn.utils.clip_grad_norm_`` stacks the per-parameter norms, which fails when
parameters are DTensors on different meshes, or DTensors beside plain tensors: under tensor
parallelism the split layers' gradients live on the TP mesh and the rest are plain or
replicated ("All operands in aten.stack.default must have the same mesh"; Lightning's
``trainer.gradient_clip_val`` goes there). As torchtitan's ``clip_grad_norm_`` does, the
norm is taken per mesh, made a plain tensor (``full_tensor``: one all-reduce per mesh), and
the per-mesh norms combined; the clipping itself is torch's ``clip_grads_with_norm_``.
Everything stays on the device: no host synchronisation.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager

import torch
from torch.distributed.tensor import DTensor

#: DTensor's advice to flatten a 2-D mesh, said at every reduction of a norm over both dimensions
_REDISTRIBUTE = logging.getLogger("torch.distributed.tensor._redistribute")


def by_mesh(tensors: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """``tensors`` grouped by device mesh (plain tensors together): one op may not mix them."""
    groups: dict[object, list[torch.Tensor]] = {}
    for t in tensors:
        groups.setdefault(t.device_mesh if isinstance(t, DTensor) else None, []).append(t)
    return list(groups.values())


def total_norm(grads: list[torch.Tensor], norm_type: float = 2.0) -> torch.Tensor:
    """The norm of all ``grads`` together, a plain tensor equal on every process."""
    groups = by_mesh(grads)
    with _quiet_redistribute(_any_dtensor(groups)):
        norms = [torch.nn.utils.get_total_norm(g, norm_type) for g in groups]
        norms = [n.full_tensor() if isinstance(n, DTensor) else n for n in norms]
    if not norms:
        return torch.zeros(())
    devices = {n.device for n in norms}
    device = next(iter(devices))
    return torch.nn.utils.get_total_norm([n.to(device) for n in norms], norm_type)


def _any_dtensor(groups: list[list[torch.Tensor]]) -> bool:
    return any(isinstance(g[0], DTensor) for g in groups)


@contextmanager
def _quiet_redistribute(dtensors: bool):
    """DTensor's advice kept off the console while norms of DTensors are taken (stacking the
    per-tensor norms redistributes too, not only ``full_tensor``). Plain tensors: nothing
    done, since a logger's ``setLevel`` clears every logger's cache, once a step."""
    if not dtensors:
        yield
        return
    level = _REDISTRIBUTE.level
    _REDISTRIBUTE.setLevel(logging.ERROR)
    try:
        yield
    finally:
        _REDISTRIBUTE.setLevel(level)


def clip_grad_norm_(parameters, max_norm: float | None, norm_type: float = 2.0) -> torch.Tensor:
    """Scale the gradients of ``parameters`` so their total norm is at most ``max_norm``
    (None: measure only); returns the norm before clipping."""
    params = [p for p in parameters if p.grad is not None]
    norm = total_norm([p.grad for p in params], norm_type)
    if max_norm is not None and params:
        for group in by_mesh(params):  # torch's foreach multiply may not mix meshes either
            torch.nn.utils.clip_grads_with_norm_(group, max_norm, norm)
    return norm


class GradNorm:
    """The gradient norm's figures for the summary, kept as device tensors until the end."""

    def __init__(self) -> None:
        self.last = self.peak = self.clipped = None
        self.measured = 0

    def add(self, norm: torch.Tensor, max_norm: float | None) -> None:
        norm = norm.detach()
        self.last = norm
        self.peak = norm if self.peak is None else torch.maximum(self.peak, norm)
        if max_norm is not None:
            over = (norm > max_norm).to(torch.int64)
            self.clipped = over if self.clipped is None else self.clipped + over
        self.measured += 1

    def summary(self) -> dict:
        if self.last is None:
            return {}
        figures = {
            "last": float(self.last),
            "max": float(self.peak),
            "measured_steps": self.measured,
        }
        if self.clipped is not None:
            figures["clipped_steps"] = int(self.clipped)
        return {"grad_norm": figures}
