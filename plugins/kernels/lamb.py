"""LAMB: Adam whose step for each tensor is rescaled by the trust ratio ||w|| / ||update||.

You et al. 2019, "Large Batch Optimization for Deep Learning: Training BERT in 76 Minutes"
(arXiv:1904.00962), Algorithm 2 with bias correction and phi = identity:

    m = b1 m + (1 - b1) g          v = b2 v + (1 - b2) g^2
    u = (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps) + wd w
    w = w - lr * (||w|| / ||u||) * u       (ratio 1 where either norm is 0)

Why fused: the per-tensor norms make an eager step a dozen launches per parameter; the fused
step is two multi-tensor Triton launches per parameter group (moments + norms, then update).

Here: the optimizer, its fp32 moments (kept so through ``load_state_dict``) and the reference
step, plain PyTorch one tensor at a time; the fused step and its kernels are in
:mod:`plugins.kernels.lamb_triton`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .lamb_triton import step_triton
from .trust_ratio import TrustRatioOptimizer, is_excluded

OP_NAME = "lamb"


class Lamb(TrustRatioOptimizer):
    """LAMB with weight-decay and trust-ratio exclusion for biases and norms.

    exclude_norms_and_biases: parameters with ndim <= 1 (biases, norm scales) get no weight
        decay and a trust ratio of 1 (a plain Adam step), as in the paper's BERT training.
        A param-group option, so groups may differ.
    trust_clip: upper bound on the trust ratio (None: unbounded; 1.0 gives "LAMBC").
    fused: run the Triton kernels; needs CUDA parameters and Triton (or `triton_on_cpu`) and
        raises otherwise, rather than silently running the reference.

    `implementation` holds what the last step ran ("triton" or "reference").

    Half-precision parameters (fp16-true, bf16-true): the moments are kept in fp32 and the step
    computed in fp32, the weights rounded once. In fp16, (1 - b2) g^2 of a typical gradient
    (g ~ 0.03) is about 1e-6, a subnormal with a few bits left or zero, and sqrt(v) + eps then
    blows single elements' updates up by orders of magnitude (measured: weights 300x off
    fp32 arithmetic after 5 steps; tests/kernels). The moments cost 8 bytes per parameter, and
    stay fp32 through ``load_state_dict`` (which casts state to each parameter's dtype).

    AMP: when `grad_scale` / `found_inf` tensors are set on the optimizer (GradScaler does so
    for fused optimizers, which advertise `_step_supports_amp_scaling`), gradients are unscaled
    inside the update and the step, step count included, is skipped when found_inf != 0:
    without a host sync on the fused path, with one on the reference path.
    """

    OP_NAME = OP_NAME

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.01,
        exclude_norms_and_biases: bool = True,
        trust_clip: float | None = None,
        fused: bool = False,
    ):
        if lr < 0 or eps < 0 or weight_decay < 0 or not all(0 <= b < 1 for b in betas):
            raise ValueError(f"invalid Lamb hyperparameters: {lr=} {betas=} {eps=} {weight_decay=}")
        defaults = dict(
            lr=lr,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            exclude_norms_and_biases=exclude_norms_and_biases,
            trust_clip=trust_clip,
        )
        super().__init__(params, defaults, fused)
        self._loaded_moments: dict[Tensor, dict[str, Tensor]] = {}
        self.register_load_state_dict_pre_hook(_keep_loaded_moments)
        self.register_load_state_dict_post_hook(_restore_fp32_moments)

    def _state(self, param: Tensor) -> dict:
        state = self.state[param]
        if not state:
            state["step"] = torch.zeros((), dtype=torch.float32, device=param.device)
            state["exp_avg"] = torch.zeros_like(param, dtype=torch.float32)
            state["exp_avg_sq"] = torch.zeros_like(param, dtype=torch.float32)
        elif state["step"].device != param.device:  # as loaded from a state dict
            state["step"] = state["step"].to(param.device, torch.float32)
        return state


MOMENTS = ("exp_avg", "exp_avg_sq")


def _keep_loaded_moments(optimizer: Lamb, state_dict: dict) -> None:
    """Before ``load_state_dict``: the saved moments, by parameter. torch casts every state
    tensor to its parameter's dtype, which would round fp32 moments to fp16."""
    saved = [i for group in state_dict["param_groups"] for i in group["params"]]
    live = [p for group in optimizer.param_groups for p in group["params"]]
    optimizer._loaded_moments = {
        param: {k: state_dict["state"][i][k] for k in MOMENTS if k in state_dict["state"][i]}
        for i, param in zip(saved, live, strict=False)
        if i in state_dict["state"]
    }


def _restore_fp32_moments(optimizer: Lamb) -> None:
    """After it: those moments in fp32 on each parameter's device (an older run's fp16 ones too)."""
    for param, moments in optimizer._loaded_moments.items():
        for key, value in moments.items():
            optimizer.state[param][key] = value.to(param.device, torch.float32)
    optimizer._loaded_moments = {}


def trust_ratio(weight_norm: Tensor, update_norm: Tensor, clip: float | None) -> Tensor:
    ratio = torch.where((weight_norm > 0) & (update_norm > 0), weight_norm / update_norm, 1.0)
    return ratio if clip is None else ratio.clamp(max=clip)


def _step_reference(group, params, states, grad_scale, found_inf):
    """One tensor at a time in plain PyTorch, in fp32 (syncs on found_inf to skip the step)."""
    if found_inf is not None and found_inf.item() != 0:
        return
    beta1, beta2 = group["betas"]
    for param, state in zip(params, states, strict=True):
        grad = param.grad.float()
        if grad_scale is not None:
            grad = grad / grad_scale.to(param.device)
        weight = param.float()  # param itself where it is fp32
        state["step"] += 1
        exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
        exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        exp_avg_hat = exp_avg / (1 - beta1 ** state["step"])
        exp_avg_sq_hat = exp_avg_sq / (1 - beta2 ** state["step"])
        update = exp_avg_hat / (exp_avg_sq_hat.sqrt() + group["eps"])
        if not is_excluded(group, param):
            update.add_(weight, alpha=group["weight_decay"])
            update.mul_(trust_ratio(weight.norm(), update.norm(), group["trust_clip"]))
        param.copy_(weight - group["lr"] * update)  # one rounding to a half-precision param


# The reference step is defined below the class, so both steps are attached here.
Lamb.step_reference = staticmethod(_step_reference)
Lamb.step_triton = staticmethod(step_triton)
