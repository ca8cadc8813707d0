"""Cross-entropy row by row: each row's loss and d loss / d logits, from one read of the row.

The computation under the fused ops: :mod:`plugins.kernels.cross_entropy` runs it on the
whole logits, :mod:`plugins.kernels.linear_cross_entropy` on each chunk of the head's output.
Two implementations of :func:`cross_entropy_rows`: plain PyTorch (the CPU path and the test
oracle) and a Triton kernel (online softmax) with the launch it runs under (:func:`launch`;
bench/kernels.py times alternatives through :data:`LAUNCH`).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from .triton_support import TRITON, tl, triton

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


def loss_dtype(logits_dtype: torch.dtype) -> torch.dtype:
    """fp32, or fp64 for fp64 logits: half-precision losses lose too much when averaged."""
    return torch.promote_types(logits_dtype, torch.float32)


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
