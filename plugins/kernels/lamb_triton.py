"""LAMB's fused step: two multi-tensor Triton launches per parameter group.

Pass 1 updates the moments and sums, per tensor, the squares of the weights and of the update
direction; pass 2 takes each tensor's trust ratio from those norms and writes the weights. A
program updates ``CHUNK_NUMEL`` elements of one tensor, found through a table of raw addresses
(triton_support's ``pointer_table``). The optimizer, its state and the reference step it is
checked against are in :mod:`plugins.kernels.lamb`.
"""

from __future__ import annotations

import torch

from .triton_support import launch_groups, pointer_table, tl, triton

if triton is not None:
    from .triton_support import inverse_grad_scale, program_chunk
from .trust_ratio import is_excluded

#: Elements of one tensor a Triton program updates, and per loop iteration (tests shrink them).
CHUNK_NUMEL = 16384
BLOCK = 1024


def step_triton(group, params, states, grad_scale, found_inf):
    """``Lamb(fused=True)``'s step: the step counts on the device (less found_inf: a skipped
    step counts nothing), then two launches per group of tensors of the same dtypes."""
    steps = [state["step"] for state in states]
    torch._foreach_add_(steps, 1.0)
    if found_inf is not None:
        found_inf = found_inf.to(params[0].device)
        torch._foreach_sub_(steps, [found_inf] * len(steps))
    for indices in launch_groups(params):
        subset = [params[i] for i in indices], [states[i] for i in indices]
        _launch(group, *subset, grad_scale, found_inf)


def _launch(group, params, states, grad_scale, found_inf):
    """Pass 1: moments and squared norms of weights and updates; pass 2: the update."""
    grads = [p.grad for p in params]
    columns = [params, grads, *([s[k] for s in states] for k in ("exp_avg", "exp_avg_sq", "step"))]
    table = pointer_table(columns, [is_excluded(group, p) for p in params], CHUNK_NUMEL)
    norms = torch.zeros(len(params), 2, dtype=torch.float32, device=params[0].device)
    beta1, beta2 = group["betas"]
    common = (
        table.addresses,
        table.numels,
        table.excluded,
        table.chunks,
        norms,
        norms if grad_scale is None else grad_scale.to(norms.device),
        norms if found_inf is None else found_inf,
        params[0],
        grads[0],
        beta1,
        beta2,
        group["eps"],
    )
    flags = dict(
        HAS_GRAD_SCALE=grad_scale is not None,
        HAS_FOUND_INF=found_inf is not None,
        CHUNK=CHUNK_NUMEL,
        BLOCK=BLOCK,
    )
    if table.n_chunks == 0:  # only empty tensors
        return
    grid = (table.n_chunks,)
    _lamb_moments_kernel[grid](*common, group["weight_decay"], **flags)
    clip = group["trust_clip"]
    _lamb_update_kernel[grid](
        *common,
        group["weight_decay"],
        float(group["lr"]),
        0.0 if clip is None else clip,
        HAS_TRUST_CLIP=clip is not None,
        **flags,
    )


if triton is not None:

    @triton.jit
    def _lamb_update_direction(param, exp_avg, exp_avg_sq, bias1, bias2, eps, weight_decay):
        """u = m_hat / (sqrt(v_hat) + eps) + wd * w."""
        return (exp_avg / bias1) / (tl.sqrt(exp_avg_sq / bias2) + eps) + weight_decay * param

    @triton.jit
    def _lamb_moments_kernel(
        addresses,
        numels,
        excluded,
        chunks,
        norms,
        grad_scale_ptr,
        found_inf_ptr,
        param_like,
        grad_like,
        beta1,
        beta2,
        eps,
        weight_decay,
        HAS_GRAD_SCALE: tl.constexpr,
        HAS_FOUND_INF: tl.constexpr,
        CHUNK: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        index, start, numel = program_chunk(chunks, numels, found_inf_ptr, HAS_FOUND_INF)
        param_ptr = tl.load(addresses + 5 * index).to(param_like.dtype)
        grad_ptr = tl.load(addresses + 5 * index + 1).to(grad_like.dtype)
        exp_avg_ptr = tl.load(addresses + 5 * index + 2).to(tl.pointer_type(tl.float32))
        exp_avg_sq_ptr = tl.load(addresses + 5 * index + 3).to(tl.pointer_type(tl.float32))
        step = tl.load(tl.load(addresses + 5 * index + 4).to(tl.pointer_type(tl.float32)))
        bias1 = 1.0 - tl.exp2(step * tl.log2(beta1))
        bias2 = 1.0 - tl.exp2(step * tl.log2(beta2))
        inv_scale = inverse_grad_scale(grad_scale_ptr, HAS_GRAD_SCALE)
        decay = tl.where(tl.load(excluded + index) != 0, 0.0, weight_decay)
        weight_sq = tl.zeros([BLOCK], tl.float32)
        update_sq = tl.zeros([BLOCK], tl.float32)
        limit, offset = tl.minimum(numel - start, CHUNK), 0
        while offset < limit:  # not a for-range loop: see triton_support's docstring
            elements = start + offset + tl.arange(0, BLOCK)
            mask = elements < numel
            param = tl.load(param_ptr + elements, mask=mask, other=0.0).to(tl.float32)
            grad = tl.load(grad_ptr + elements, mask=mask, other=0.0).to(tl.float32) * inv_scale
            exp_avg = tl.load(exp_avg_ptr + elements, mask=mask, other=0.0)
            exp_avg_sq = tl.load(exp_avg_sq_ptr + elements, mask=mask, other=0.0)
            exp_avg = beta1 * exp_avg + (1.0 - beta1) * grad
            exp_avg_sq = beta2 * exp_avg_sq + (1.0 - beta2) * grad * grad
            tl.store(exp_avg_ptr + elements, exp_avg, mask=mask)  # fp32 moments (see Lamb)
            tl.store(exp_avg_sq_ptr + elements, exp_avg_sq, mask=mask)
            update = _lamb_update_direction(param, exp_avg, exp_avg_sq, bias1, bias2, eps, decay)
            weight_sq += param * param
            update_sq += tl.where(mask, update * update, 0.0)
            offset += BLOCK
        tl.atomic_add(norms + 2 * index, tl.sum(weight_sq, 0))
        tl.atomic_add(norms + 2 * index + 1, tl.sum(update_sq, 0))

    @triton.jit
    def _lamb_update_kernel(
        addresses,
        numels,
        excluded,
        chunks,
        norms,
        grad_scale_ptr,
        found_inf_ptr,
        param_like,
        grad_like,
        beta1,
        beta2,
        eps,
        weight_decay,
        lr,
        trust_clip,
        HAS_TRUST_CLIP: tl.constexpr,
        HAS_GRAD_SCALE: tl.constexpr,
        HAS_FOUND_INF: tl.constexpr,
        CHUNK: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        index, start, numel = program_chunk(chunks, numels, found_inf_ptr, HAS_FOUND_INF)
        param_ptr = tl.load(addresses + 5 * index).to(param_like.dtype)
        exp_avg_ptr = tl.load(addresses + 5 * index + 2).to(tl.pointer_type(tl.float32))
        exp_avg_sq_ptr = tl.load(addresses + 5 * index + 3).to(tl.pointer_type(tl.float32))
        step = tl.load(tl.load(addresses + 5 * index + 4).to(tl.pointer_type(tl.float32)))
        bias1 = 1.0 - tl.exp2(step * tl.log2(beta1))
        bias2 = 1.0 - tl.exp2(step * tl.log2(beta2))
        is_excluded = tl.load(excluded + index) != 0
        decay = tl.where(is_excluded, 0.0, weight_decay)
        weight_norm = tl.sqrt(tl.load(norms + 2 * index))
        update_norm = tl.sqrt(tl.load(norms + 2 * index + 1))
        both_positive = (weight_norm > 0) & (update_norm > 0)
        ratio = tl.where(
            both_positive, weight_norm / tl.where(both_positive, update_norm, 1.0), 1.0
        )
        if HAS_TRUST_CLIP:
            ratio = tl.minimum(ratio, trust_clip)
        step_size = lr * tl.where(is_excluded, 1.0, ratio)
        limit, offset = tl.minimum(numel - start, CHUNK), 0
        while offset < limit:  # not a for-range loop: see triton_support's docstring
            elements = start + offset + tl.arange(0, BLOCK)
            mask = elements < numel
            param = tl.load(param_ptr + elements, mask=mask, other=0.0).to(tl.float32)
            exp_avg = tl.load(exp_avg_ptr + elements, mask=mask, other=0.0)
            exp_avg_sq = tl.load(exp_avg_sq_ptr + elements, mask=mask, other=0.0)
            update = _lamb_update_direction(param, exp_avg, exp_avg_sq, bias1, bias2, eps, decay)
            param = param - step_size * update
            tl.store(param_ptr + elements, param.to(param_like.dtype.element_ty), mask=mask)
            offset += BLOCK
