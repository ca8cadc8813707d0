"""LARS: momentum SGD with a per-tensor learning rate from the ratio ||w|| / ||g||.

You et al. 2017, "Large Batch Training of Convolutional Networks" (arXiv:1708.03888),
Algorithm 1, with eps in the denominator:

    local_lr = eta * ||w|| / (||g|| + wd ||w|| + eps)     (1 where either norm is 0)
    v = momentum v + lr * local_lr * (g + wd w)           (v starts at 0)
    w = w - v

Why fused: the two norms per tensor make an eager step many launches per parameter; the fused
step is two multi-tensor Triton launches per parameter group (norms, then update).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .triton_support import launch_groups, pointer_table, tl, triton

if triton is not None:
    from .triton_support import inverse_grad_scale, program_chunk
from .trust_ratio import TrustRatioOptimizer, is_excluded

OP_NAME = "lars"

#: Elements of one tensor a Triton program updates, and per loop iteration (tests shrink them).
CHUNK_NUMEL = 16384
BLOCK = 1024


class Lars(TrustRatioOptimizer):
    """LARS with weight-decay and trust-ratio exclusion for biases and norms.

    trust_coefficient: eta above. exclude_norms_and_biases: parameters with ndim <= 1 get no
        weight decay and local_lr 1 (plain momentum SGD); a param-group option.
    fused: run the Triton kernels; needs CUDA parameters and Triton (or `triton_on_cpu`) and
        raises otherwise. `implementation` holds what the last step ran.
    GradScaler's `grad_scale` / `found_inf` are honoured as in `Lamb`.
    """

    OP_NAME = OP_NAME

    def __init__(
        self,
        params,
        lr: float = 1.0,
        momentum: float = 0.9,
        weight_decay: float = 1e-4,
        trust_coefficient: float = 0.001,
        eps: float = 1e-8,
        exclude_norms_and_biases: bool = True,
        fused: bool = False,
    ):
        if min(lr, momentum, weight_decay, trust_coefficient, eps) < 0:
            raise ValueError(
                f"invalid Lars hyperparameters: {lr=} {momentum=} {weight_decay=} "
                f"{trust_coefficient=} {eps=}"
            )
        defaults = dict(
            lr=lr,
            momentum=momentum,
            weight_decay=weight_decay,
            trust_coefficient=trust_coefficient,
            eps=eps,
            exclude_norms_and_biases=exclude_norms_and_biases,
        )
        super().__init__(params, defaults, fused)

    def _state(self, param: Tensor) -> Tensor:
        """The momentum buffer."""
        state = self.state[param]
        if not state:
            state["momentum_buffer"] = torch.zeros_like(param)
        return state["momentum_buffer"]


def local_lr(group: dict, weight_norm: Tensor, grad_norm: Tensor) -> Tensor:
    ratio = (
        group["trust_coefficient"]
        * weight_norm
        / (grad_norm + group["weight_decay"] * weight_norm + group["eps"])
    )
    return torch.where((weight_norm > 0) & (grad_norm > 0), ratio, 1.0)


def _step_reference(group, params, buffers, grad_scale, found_inf):
    """One tensor at a time in plain PyTorch (syncs on found_inf to skip the step)."""
    if found_inf is not None and found_inf.item() != 0:
        return
    for param, buffer in zip(params, buffers, strict=True):
        grad = param.grad if grad_scale is None else param.grad / grad_scale.to(param.device)
        if is_excluded(group, param):
            update, scale = grad, group["lr"]
        else:
            update = grad.add(param, alpha=group["weight_decay"])
            scale = group["lr"] * local_lr(group, param.norm(), grad.norm())
        buffer.mul_(group["momentum"]).add_(update * scale)
        param.sub_(buffer)


def _step_triton(group, params, buffers, grad_scale, found_inf):
    for indices in launch_groups(params):
        subset = [params[i] for i in indices], [buffers[i] for i in indices]
        _launch(group, *subset, grad_scale, found_inf)


def _launch(group, params, buffers, grad_scale, found_inf):
    """Pass 1: squared norms of weights and gradients; pass 2: momentum and weights."""
    grads = [p.grad for p in params]
    excluded = [is_excluded(group, p) for p in params]
    table = pointer_table([params, grads, buffers], excluded, CHUNK_NUMEL)
    norms = torch.zeros(len(params), 2, dtype=torch.float32, device=params[0].device)
    common = (
        table.addresses,
        table.numels,
        table.excluded,
        table.chunks,
        norms,
        norms if grad_scale is None else grad_scale.to(norms.device),
        norms if found_inf is None else found_inf.to(norms.device),
        params[0],
        grads[0],
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
    _lars_norms_kernel[grid](*common, **flags)
    _lars_update_kernel[grid](
        *common,
        float(group["lr"]),
        group["momentum"],
        group["weight_decay"],
        group["trust_coefficient"],
        group["eps"],
        **flags,
    )


if triton is not None:

    @triton.jit
    def _lars_norms_kernel(
        addresses,
        numels,
        excluded,
        chunks,
        norms,
        grad_scale_ptr,
        found_inf_ptr,
        param_like,
        grad_like,
        HAS_GRAD_SCALE: tl.constexpr,
        HAS_FOUND_INF: tl.constexpr,
        CHUNK: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        index, start, numel = program_chunk(chunks, numels, found_inf_ptr, HAS_FOUND_INF)
        param_ptr = tl.load(addresses + 3 * index).to(param_like.dtype)
        grad_ptr = tl.load(addresses + 3 * index + 1).to(grad_like.dtype)
        inv_scale = inverse_grad_scale(grad_scale_ptr, HAS_GRAD_SCALE)
        weight_sq = tl.zeros([BLOCK], tl.float32)
        grad_sq = tl.zeros([BLOCK], tl.float32)
        limit, offset = tl.minimum(numel - start, CHUNK), 0
        while offset < limit:  # not a for-range loop: see triton_support's docstring
            elements = start + offset + tl.arange(0, BLOCK)
            mask = elements < numel
            param = tl.load(param_ptr + elements, mask=mask, other=0.0).to(tl.float32)
            grad = tl.load(grad_ptr + elements, mask=mask, other=0.0).to(tl.float32) * inv_scale
            weight_sq += param * param
            grad_sq += grad * grad
            offset += BLOCK
        tl.atomic_add(norms + 2 * index, tl.sum(weight_sq, 0))
        tl.atomic_add(norms + 2 * index + 1, tl.sum(grad_sq, 0))

    @triton.jit
    def _lars_update_kernel(
        addresses,
        numels,
        excluded,
        chunks,
        norms,
        grad_scale_ptr,
        found_inf_ptr,
        param_like,
        grad_like,
        lr,
        momentum,
        weight_decay,
        trust_coefficient,
        eps,
        HAS_GRAD_SCALE: tl.constexpr,
        HAS_FOUND_INF: tl.constexpr,
        CHUNK: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        index, start, numel = program_chunk(chunks, numels, found_inf_ptr, HAS_FOUND_INF)
        param_ptr = tl.load(addresses + 3 * index).to(param_like.dtype)
        grad_ptr = tl.load(addresses + 3 * index + 1).to(grad_like.dtype)
        buffer_ptr = tl.load(addresses + 3 * index + 2).to(param_like.dtype)
        inv_scale = inverse_grad_scale(grad_scale_ptr, HAS_GRAD_SCALE)
        is_included = tl.load(excluded + index) == 0  # not `~is_excluded`: Triton <= 3.3's
        decay = tl.where(is_included, weight_decay, 0.0)  # interpreter cannot invert a bool
        weight_norm = tl.sqrt(tl.load(norms + 2 * index))
        grad_norm = tl.sqrt(tl.load(norms + 2 * index + 1))
        adapted = (weight_norm > 0) & (grad_norm > 0) & is_included
        denominator = tl.where(adapted, grad_norm + weight_decay * weight_norm + eps, 1.0)
        ratio = tl.where(adapted, trust_coefficient * weight_norm / denominator, 1.0)
        step_size = lr * ratio
        limit, offset = tl.minimum(numel - start, CHUNK), 0
        while offset < limit:  # not a for-range loop: see triton_support's docstring
            elements = start + offset + tl.arange(0, BLOCK)
            mask = elements < numel
            param = tl.load(param_ptr + elements, mask=mask, other=0.0).to(tl.float32)
            grad = tl.load(grad_ptr + elements, mask=mask, other=0.0).to(tl.float32) * inv_scale
            buffer = tl.load(buffer_ptr + elements, mask=mask, other=0.0).to(tl.float32)
            buffer = momentum * buffer + step_size * (grad + decay * param)
            tl.store(buffer_ptr + elements, buffer.to(param_like.dtype.element_ty), mask=mask)
            tl.store(
                param_ptr + elements, (param - buffer).to(param_like.dtype.element_ty), mask=mask
            )
            offset += BLOCK


# The step functions are defined below the class, so they are attached here.
Lars.step_reference = staticmethod(_step_reference)
Lars.step_triton = staticmethod(_step_triton)
