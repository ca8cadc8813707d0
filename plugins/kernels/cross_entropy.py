"""Fused cross-entropy: loss and gradient from one kernel (online softmax).

Why: unfused, the loss keeps a log-softmax of the [N, V] logits for backward, in fp32 when
the logits are half precision. Here the forward kernel writes d loss / d logits directly, in the
logits' dtype, while each row is hot; backward only scales it by the incoming gradient.
Semantics are those of ``F.cross_entropy(..., reduction="mean")`` with label smoothing and
ignore_index; the loss is fp32 (fp64 for fp64 logits).

Here: the ``tuneup::cross_entropy`` op (its fake and autograd) and the target check it shares
with linear_cross_entropy; the rows' computation, reference and Triton kernel, is in
:mod:`plugins.kernels.cross_entropy_rows`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import triton_support
from .cross_entropy_rows import cross_entropy_rows, loss_dtype

OP_NAME = "cross_entropy"


def cross_entropy(
    logits: Tensor, target: Tensor, *, label_smoothing: float = 0.0, ignore_index: int = -100
) -> Tensor:
    """Mean cross-entropy of logits [N, V] against int64 targets [N], ignored rows excluded.

    Differentiable once: the gradient is computed in forward (no double backward).
    """
    compute_grad = torch.is_grad_enabled() and logits.requires_grad
    loss, _ = cross_entropy_op(logits, target, label_smoothing, ignore_index, compute_grad)
    return loss


@torch.library.custom_op("tuneup::cross_entropy", mutates_args=())
def cross_entropy_op(
    logits: Tensor, target: Tensor, label_smoothing: float, ignore_index: int, compute_grad: bool
) -> tuple[Tensor, Tensor]:
    """(mean loss, d loss / d logits); the gradient is empty unless `compute_grad`."""
    implementation = triton_support.implementation(logits.device)
    triton_support.record(OP_NAME, implementation)
    check_targets(target, logits.shape[1], ignore_index)
    n_valid = (target != ignore_index).sum()
    grad = _empty_grad(logits, compute_grad)
    row_losses = cross_entropy_rows(
        logits,
        target,
        n_valid,
        label_smoothing,
        ignore_index,
        grad if compute_grad else None,
        implementation,
    )
    return row_losses.sum() / n_valid, grad


@cross_entropy_op.register_fake
def _(logits, target, label_smoothing, ignore_index, compute_grad):
    loss = logits.new_empty((), dtype=loss_dtype(logits.dtype))
    return loss, _empty_grad(logits, compute_grad)


def _empty_grad(logits: Tensor, compute_grad: bool) -> Tensor:
    """Row-major like the kernel writes it, whatever the logits' strides; empty if unused."""
    if not compute_grad:
        return logits.new_empty(0)
    return torch.empty_like(logits, memory_format=torch.contiguous_format)


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(output[1])
    # The gradient output is never differentiated: without this autograd fills a tensor of
    # the logits' size with zeros for it in every backward (1 GiB at 16k x 32k bf16)
    ctx.set_materialize_grads(False)


def _backward(ctx, grad_loss, _grad_of_grad):
    if grad_loss is None:  # undefined: nothing flows back (grads are not materialized)
        return None, None, None, None, None
    (grad_logits,) = ctx.saved_tensors
    return grad_logits * grad_loss.to(grad_logits.dtype), None, None, None, None


cross_entropy_op.register_autograd(_backward, setup_context=_setup_context)


def check_targets(target: Tensor, n_classes: int, ignore_index: int) -> None:
    """Fail like F.cross_entropy on out-of-range targets (asynchronously on a GPU)."""
    in_range = ((target >= 0) & (target < n_classes)) | (target == ignore_index)
    torch._assert_async(in_range.all(), "cross_entropy: target out of range")
