"""Fused cross-entropy: loss and gradient from one kernel (online softmax).

Why: unfused, the loss keeps a log-softmax of the [N, V] logits for backward, in fp32 when
the logits are half precision. Here the forward kernel writes d loss / d logits directly, in the
logits' dtype, while each row is hot; backward only scales it by the incoming gradient.
Semantics are those of ``F.cross_entropy(..., reduction="mean")`` with label smoothing and
ignore_index; the loss is fp32 (fp64 for fp64 logits).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from . import triton_support
from .triton_support import TRITON, tl, triton

OP_NAME = "cross_entropy"

#: Rows up to this many classes are held in registers: logits are read once. Wider rows are
#: read twice, MAX_BLOCK classes at a time (tests shrink both to exercise every path).
MAX_ONE_PASS = 32768
MAX_BLOCK = 4096


class Launch(NamedTuple):
    """How the rows kernel runs: one pass from registers, or two passes of ``block`` classes;
    ``num_warps`` per program; ``programs`` that loop over the rows (None: one per row)."""

    one_pass: bool
    block: int
    num_warps: int
    programs: int | None = None


#: A launch for every call instead of :func:`launch`'s (bench/kernels.py times alternatives).
LAUNCH: Launch | None = None


def launch(n_classes: int) -> Launch:
    """The launch for rows of ``n_classes``.

    One pass holds a whole row in registers: at 32,768 classes that is 64 registers for each
    of 1,024 threads (ptxas for sm_90), the whole register file of an SM, so one row per SM
    at a time and nothing overlaps its load, reductions and store. Two passes of MAX_BLOCK
    run several programs per SM; their second read comes from L2 if the rows in flight fit
    there. bench/kernels.py times both (docs/benchmarks.md#kernels).
    """
    if LAUNCH is not None:
        return LAUNCH
    if triton.next_power_of_2(n_classes) <= MAX_ONE_PASS:
        block = triton.next_power_of_2(n_classes)
        return Launch(True, block, min(32, max(4, block // 512)))
    return Launch(False, MAX_BLOCK, min(32, max(4, MAX_BLOCK // 512)))


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


def loss_dtype(logits_dtype: torch.dtype) -> torch.dtype:
    """fp32, or fp64 for fp64 logits: half-precision losses lose too much when averaged."""
    return torch.promote_types(logits_dtype, torch.float32)


def check_targets(target: Tensor, n_classes: int, ignore_index: int) -> None:
    """Fail like F.cross_entropy on out-of-range targets (asynchronously on a GPU)."""
    in_range = ((target >= 0) & (target < n_classes)) | (target == ignore_index)
    torch._assert_async(in_range.all(), "cross_entropy: target out of range")


def cross_entropy_rows(
    logits: Tensor,
    target: Tensor,
    n_valid: Tensor,
    label_smoothing: float,
    ignore_index: int,
    grad_out: Tensor | None,
    implementation: str,
) -> Tensor:
    """Per-row losses (0 for ignored rows); writes d(sum of losses / n_valid) / d logits.

    `grad_out` may be `logits` itself: each element is read before its gradient is written.
    Shared with the chunked linear + cross-entropy, which passes each chunk's logits.
    """
    rows = _rows_triton if implementation == TRITON else _rows_reference
    return rows(logits, target, n_valid, label_smoothing, ignore_index, grad_out)


def _rows_reference(logits, target, n_valid, label_smoothing, ignore_index, grad_out):
    """Plain PyTorch: the CPU path and the test oracle for the kernel."""
    x = logits.to(loss_dtype(logits.dtype))
    n_classes = x.shape[1]
    valid = target != ignore_index
    target_or_0 = torch.where(valid, target, 0)[:, None]
    log_sum_exp = torch.logsumexp(x, 1)
    target_logit = x.gather(1, target_or_0)[:, 0]
    row_losses = log_sum_exp - (1 - label_smoothing) * target_logit
    if label_smoothing:  # skipped at 0, where 0 * (-inf logits) would make it nan
        row_losses = row_losses - label_smoothing / n_classes * x.sum(1)
    if grad_out is not None:
        grad = torch.exp(x - log_sum_exp[:, None]) - label_smoothing / n_classes
        target_share = torch.full_like(x[:, :1], label_smoothing - 1)
        grad.scatter_add_(1, target_or_0, target_share)
        grad_out.copy_(grad * (valid.to(x.dtype)[:, None] / n_valid))
    return torch.where(valid, row_losses, 0)


def _rows_triton(logits, target, n_valid, label_smoothing, ignore_index, grad_out):
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    n_rows, n_classes = logits.shape
    row_losses = logits.new_empty(n_rows, dtype=loss_dtype(logits.dtype))
    how = launch(n_classes)
    grad = logits if grad_out is None else grad_out
    assert grad.stride(1) == 1, "the kernel writes gradient rows contiguously"
    _cross_entropy_rows_kernel[(min(n_rows, how.programs or n_rows),)](
        logits,
        logits.stride(0),
        target,
        grad,
        grad.stride(0),
        row_losses,
        n_valid,
        n_rows,
        n_classes,
        ignore_index,
        label_smoothing,
        COMPUTE_GRAD=grad_out is not None,
        ONE_PASS=how.one_pass,
        BLOCK=how.block,
        PERSISTENT=how.programs is not None,
        num_warps=how.num_warps,
    )
    return row_losses


if triton is not None:

    @triton.jit
    def _cross_entropy_rows_kernel(
        logits_ptr,
        logits_row_stride,
        target_ptr,
        grad_ptr,
        grad_row_stride,
        row_loss_ptr,
        n_valid_ptr,
        n_rows,
        n_classes,
        ignore_index,
        label_smoothing,
        COMPUTE_GRAD: tl.constexpr,
        ONE_PASS: tl.constexpr,
        BLOCK: tl.constexpr,
        PERSISTENT: tl.constexpr,
    ):
        """One row per program, or (PERSISTENT) rows pid, pid + programs, ...: log-sum-exp
        (from registers if the row fits in one block, else online over blocks), then loss and
        gradient. The row loop is a constexpr choice: it costs registers (ptxas for sm_90:
        80 instead of 64 at 8 warps and 4,096 classes a block), so fewer programs fit an SM.

        Two passes read a row twice: the first pass asks L2 to keep it (evict_last), the
        second and the gradient's stores let it go (evict_first), so the second read can
        come from L2 while few enough rows are in flight.
        """
        row = tl.program_id(0).to(tl.int64)
        lanes = tl.arange(0, BLOCK)
        if PERSISTENT:
            while row < n_rows:  # not a for-range loop: see triton_support's docstring
                _one_row(
                    logits_ptr + row * logits_row_stride,
                    tl.load(target_ptr + row),
                    grad_ptr + row * grad_row_stride,
                    row_loss_ptr + row,
                    n_valid_ptr,
                    n_classes,
                    ignore_index,
                    label_smoothing,
                    lanes,
                    COMPUTE_GRAD,
                    ONE_PASS,
                    BLOCK,
                )
                row += tl.num_programs(0)
        else:
            _one_row(
                logits_ptr + row * logits_row_stride,
                tl.load(target_ptr + row),
                grad_ptr + row * grad_row_stride,
                row_loss_ptr + row,
                n_valid_ptr,
                n_classes,
                ignore_index,
                label_smoothing,
                lanes,
                COMPUTE_GRAD,
                ONE_PASS,
                BLOCK,
            )

    @triton.jit
    def _one_row(
        logits_ptr,
        target,
        grad_ptr,
        row_loss_ptr,
        n_valid_ptr,
        n_classes,
        ignore_index,
        label_smoothing,
        lanes,
        COMPUTE_GRAD: tl.constexpr,
        ONE_PASS: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        if target == ignore_index:
            tl.store(row_loss_ptr, 0.0)
            if COMPUTE_GRAD:
                zeros = tl.zeros([BLOCK], dtype=grad_ptr.dtype.element_ty)
                start = 0
                while start < n_classes:
                    tl.store(grad_ptr + start + lanes, zeros, mask=start + lanes < n_classes)
                    start += BLOCK
        else:
            smooth_share = label_smoothing / n_classes
            if ONE_PASS:
                mask = lanes < n_classes
                x = tl.load(
                    logits_ptr + lanes,
                    mask=mask,
                    other=float("-inf"),
                    eviction_policy="evict_first",
                ).to(tl.float32)
                row_max = tl.max(x, 0)
                shift = tl.where(row_max == float("-inf"), 0.0, row_max)  # -inf - -inf is nan
                logit_sum = 0.0
                if label_smoothing > 0:  # a block-wide reduction only when it is used
                    logit_sum = tl.sum(tl.where(mask, x, 0.0), 0)
                exps = tl.exp(x - shift)  # kept for the gradient: one exp per logit, not two
                exp_sum = tl.sum(exps, 0)
                log_sum_exp = shift + tl.log(exp_sum)
            else:
                log_sum_exp, logit_sum = _log_sum_exp_and_sum(logits_ptr, n_classes, BLOCK)
            target_logit = tl.load(logits_ptr + target).to(tl.float32)
            smoothing_term = smooth_share * tl.where(label_smoothing > 0, logit_sum, 0.0)
            loss = log_sum_exp - (1.0 - label_smoothing) * target_logit - smoothing_term
            tl.store(row_loss_ptr, loss)
            if COMPUTE_GRAD:
                scale = 1.0 / tl.load(n_valid_ptr).to(tl.float32)
                if ONE_PASS:
                    grad = exps * (1.0 / exp_sum) - smooth_share
                    grad = tl.where(lanes == target, grad - (1.0 - label_smoothing), grad)
                    grad = (grad * scale).to(grad_ptr.dtype.element_ty)
                    tl.store(grad_ptr + lanes, grad, mask=mask, eviction_policy="evict_first")
                else:
                    start = 0
                    while start < n_classes:
                        columns = start + lanes
                        mask = columns < n_classes
                        x = tl.load(
                            logits_ptr + columns,
                            mask=mask,
                            other=0.0,
                            eviction_policy="evict_first",
                        ).to(tl.float32)
                        grad = tl.exp(x - log_sum_exp) - smooth_share
                        grad = tl.where(columns == target, grad - (1.0 - label_smoothing), grad)
                        grad = (grad * scale).to(grad_ptr.dtype.element_ty)
                        tl.store(grad_ptr + columns, grad, mask=mask, eviction_policy="evict_first")
                        start += BLOCK

    @triton.jit
    def _log_sum_exp_and_sum(logits_ptr, n_classes, BLOCK: tl.constexpr):
        """Online softmax over a row wider than one block: log-sum-exp and sum of logits."""
        lanes = tl.arange(0, BLOCK)
        running_max = float("-inf")
        running_sum = 0.0
        logit_sum = 0.0
        start = 0
        while start < n_classes:  # not a for-range loop: see triton_support's docstring
            mask = start + lanes < n_classes
            x = tl.load(
                logits_ptr + start + lanes,
                mask=mask,
                other=float("-inf"),
                eviction_policy="evict_last",
            )  # read again for the gradient
            x = x.to(tl.float32)
            new_max = tl.maximum(running_max, tl.max(x, 0))
            shift = tl.where(new_max == float("-inf"), 0.0, new_max)  # -inf - -inf is nan
            running_sum = running_sum * tl.exp(running_max - shift) + tl.sum(tl.exp(x - shift), 0)
            logit_sum += tl.sum(tl.where(mask, x, 0.0), 0)
            running_max = new_max
            start += BLOCK
        return running_max + tl.log(running_sum), logit_sum
