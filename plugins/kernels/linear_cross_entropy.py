"""Chunked fused linear + cross-entropy for a language-model head.

Why: the [N, V] logits of a large vocabulary are often the largest tensor of a step. Here the
rows are taken `chunk_size` at a time: a matmul gives the chunk's logits, the fused
cross-entropy overwrites them with their gradient, and two more matmuls fold that into the
gradients of `hidden` and `weight`, all during forward. At most one chunk of logits exists.
Backward only scales the stored gradients. The weight (and bias) gradient is accumulated in
fp32 across chunks when the weight is half precision.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from . import triton_support
from .cross_entropy import check_targets
from .cross_entropy_rows import cross_entropy_rows, loss_dtype

OP_NAME = "linear_cross_entropy"


def linear_cross_entropy(
    hidden: Tensor,
    weight: Tensor,
    target: Tensor,
    bias: Tensor | None = None,
    *,
    chunk_size: int | None = None,
    label_smoothing: float = 0.0,
    ignore_index: int = -100,
) -> Tensor:
    """``F.cross_entropy(hidden @ weight.T + bias, target)`` without the full logits.

    hidden [N, D], weight [V, D], target [N] int64, bias [V] or None. `chunk_size` is rows per
    chunk; None picks `default_chunk_size`.
    """
    hidden, weight, bias = cast_like_linear(hidden, weight, bias)
    inputs = (hidden, weight) if bias is None else (hidden, weight, bias)
    compute_grad = torch.is_grad_enabled() and any(t.requires_grad for t in inputs)
    rows = default_chunk_size(*hidden.shape, weight.shape[0]) if chunk_size is None else chunk_size
    loss, *_ = linear_cross_entropy_op(
        hidden, weight, target, bias, rows, label_smoothing, ignore_index, compute_grad
    )
    return loss


def cast_like_linear(hidden: Tensor, weight: Tensor, bias: Tensor | None):
    """Cast like F.linear does under autocast (custom ops are not cast automatically)."""
    device_type = hidden.device.type
    if not torch.is_autocast_enabled(device_type):
        return hidden, weight, bias
    dtype = torch.get_autocast_dtype(device_type)
    return hidden.to(dtype), weight.to(dtype), None if bias is None else bias.to(dtype)


#: A chunk of logits is about this many times the size of `hidden` (see default_chunk_size).
CHUNK_LOGITS_PER_HIDDEN = 4


def default_chunk_size(n_rows: int, hidden_size: int, vocab_size: int) -> int:
    """Rows per chunk so that one chunk of logits is about 4x as large as `hidden`.

    Each chunk after the first adds its weight gradient into the fp32 accumulator, which
    reads and writes the whole [V, D] matrix (10 V D bytes with the half-precision product),
    so fewer chunks move less: at 16384 x 2048 -> 32768 in bf16, chunks of logits the size
    of `hidden` (16 of them) move 12 GB, 4 chunks 3 GB. The peak stays under a quarter of
    the unfused head's: 256 MB of chunk logits there, against 3.2 GB.
    """
    n_chunks = math.ceil(vocab_size / (CHUNK_LOGITS_PER_HIDDEN * hidden_size))
    return max(1, math.ceil(n_rows / n_chunks))


@torch.library.custom_op("tuneup::linear_cross_entropy", mutates_args=())
def linear_cross_entropy_op(
    hidden: Tensor,
    weight: Tensor,
    target: Tensor,
    bias: Tensor | None,
    chunk_size: int,
    label_smoothing: float,
    ignore_index: int,
    compute_grad: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(mean loss, grad hidden, grad weight, grad bias); grads are empty unless `compute_grad`.

    The bias gradient is also empty when there is no bias.
    """
    implementation = triton_support.implementation(hidden.device)
    triton_support.record(OP_NAME, implementation)
    return chunked_loss_and_grads(
        hidden,
        weight,
        target,
        bias,
        chunk_size,
        label_smoothing,
        ignore_index,
        compute_grad,
        implementation,
    )


def chunked_loss_and_grads(
    hidden: Tensor,
    weight: Tensor,
    target: Tensor,
    bias: Tensor | None,
    chunk_size: int,
    label_smoothing: float,
    ignore_index: int,
    compute_grad: bool,
    implementation: str,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The op's body: loss and gradients, one chunk of rows at a time."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    check_targets(target, weight.shape[0], ignore_index)
    n_valid = (target != ignore_index).sum()
    grads = _Grads(hidden, weight, bias, compute_grad)
    loss_sum = hidden.new_zeros((), dtype=loss_dtype(hidden.dtype))
    for start in range(0, hidden.shape[0], chunk_size):
        rows = slice(start, start + chunk_size)
        logits = _linear(hidden[rows], weight, bias)
        grad_logits = logits if compute_grad else None  # overwritten in place
        loss_sum += cross_entropy_rows(
            logits,
            target[rows],
            n_valid,
            label_smoothing,
            ignore_index,
            grad_logits,
            implementation,
        ).sum()
        if compute_grad:
            grads.add_chunk(rows, logits, hidden[rows], weight)
    return loss_sum / n_valid, *grads.results()


def _linear(hidden: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    if bias is None:
        return hidden @ weight.T
    return torch.addmm(bias, hidden, weight.T)


class _Grads:
    """Gradients of hidden, weight and bias, filled chunk by chunk.

    The first chunk writes the weight and bias gradients, later ones add to them: no zero
    fill, and one read and write of the [V, D] accumulator less.
    """

    def __init__(self, hidden: Tensor, weight: Tensor, bias: Tensor | None, enabled: bool):
        self.weight_dtype = weight.dtype
        self.bias_dtype = None if bias is None else bias.dtype
        accumulate = loss_dtype(weight.dtype)
        self.hidden = torch.empty_like(hidden) if enabled else hidden.new_empty(0)
        self.weight = torch.empty_like(weight, dtype=accumulate) if enabled else hidden.new_empty(0)
        has_bias = enabled and bias is not None
        self.bias = torch.empty_like(bias, dtype=accumulate) if has_bias else hidden.new_empty(0)
        self.chunks = 0

    def add_chunk(self, rows: slice, grad_logits: Tensor, hidden: Tensor, weight: Tensor):
        torch.mm(grad_logits, weight, out=self.hidden[rows])
        first, same_dtype = self.chunks == 0, self.weight.dtype == grad_logits.dtype
        if same_dtype:
            torch.addmm(self.weight, grad_logits.T, hidden, beta=0 if first else 1, out=self.weight)
        elif first:
            self.weight.copy_(grad_logits.T @ hidden)
        else:
            self.weight += grad_logits.T @ hidden
        if self.bias.numel() and first:
            torch.sum(grad_logits, 0, dtype=self.bias.dtype, out=self.bias)
        elif self.bias.numel():
            self.bias += grad_logits.sum(0, dtype=self.bias.dtype)
        self.chunks += 1

    def results(self) -> tuple[Tensor, Tensor, Tensor]:
        if self.chunks == 0:  # no rows: nothing was written
            self.weight.zero_()
            self.bias.zero_()
        weight = self.weight.to(self.weight_dtype) if self.weight.numel() else self.weight
        bias = self.bias.to(self.bias_dtype) if self.bias.numel() else self.bias
        return self.hidden, weight, bias


@linear_cross_entropy_op.register_fake
def _(hidden, weight, target, bias, chunk_size, label_smoothing, ignore_index, compute_grad):
    loss = hidden.new_empty((), dtype=loss_dtype(hidden.dtype))
    if not compute_grad:
        return loss, hidden.new_empty(0), hidden.new_empty(0), hidden.new_empty(0)
    grad_bias = hidden.new_empty(0) if bias is None else torch.empty_like(bias)
    return loss, torch.empty_like(hidden), torch.empty_like(weight), grad_bias


def _setup_context(ctx, inputs, output):
    ctx.has_bias = inputs[3] is not None
    ctx.save_for_backward(*output[1:])
    # The gradient outputs are never differentiated: without this autograd fills tensors of the
    # hidden states', weight's and bias' sizes with zeros for them in every backward
    ctx.set_materialize_grads(False)


def _backward(ctx, grad_loss, *_grads_of_grads):
    if grad_loss is None:  # undefined: nothing flows back (grads are not materialized)
        return None, None, None, None, *[None] * 4
    grad_hidden, grad_weight, grad_bias = (
        grad * grad_loss.to(grad.dtype) for grad in ctx.saved_tensors
    )
    return grad_hidden, grad_weight, None, grad_bias if ctx.has_bias else None, *[None] * 4


linear_cross_entropy_op.register_autograd(_backward, setup_context=_setup_context)
