"""NAdamW, AlgoPerf's baseline optimizer, chosen by ``optimizer=nadamw``.

AlgoPerf (mlcommons/algorithmic-efficiency, ``reference_algorithms/paper_baselines/nadamw``)
trains its baseline with Adam whose update uses Nesterov's look-ahead momentum (Dozat 2016, in
the form of Table 1 of Choi et al. 2019) and AdamW's decoupled weight decay. For step ``t``
(from 1), gradient ``g``, learning rate ``lr``::

    w   <- w * (1 - lr * weight_decay)
    m   <- beta1 * m + (1 - beta1) * g
    v   <- beta2 * v + (1 - beta2) * g^2
    w   <- w - lr / (1 - beta1^t) * (beta1 * m + (1 - beta1) * g)
                 / (sqrt(v) / sqrt(1 - beta2^t) + eps)

``torch.optim.NAdam(decoupled_weight_decay=True)`` is not this update: torch's NAdam scales the
momentum by a schedule ``mu_t = beta1 * (1 - 0.5 * 0.96^(t * momentum_decay))`` and bias-corrects
with the product of the ``mu``; with ``momentum_decay=0`` its ``mu`` is ``beta1 / 2``, not
``beta1``. So the update above is implemented here (tests/test_optimizers.py checks one step
against a hand computation). AlgoPerf's code mutates ``m`` and undoes the change after the
step; this computes the look-ahead into a new tensor, so ``m`` is exactly the moving average.
"""

from __future__ import annotations

import math

import torch


class NAdamW(torch.optim.Optimizer):
    """AlgoPerf's NAdamW (see the module's docstring); state per parameter: ``step`` (a float
    tensor, as torch's Adam keeps it), ``exp_avg``, ``exp_avg_sq``."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
        defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay}
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            lr, decay, eps = group["lr"], group["weight_decay"], group["eps"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = torch.tensor(0.0)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                t = state["step"].item()
                grad, m, v = p.grad, state["exp_avg"], state["exp_avg_sq"]
                p.mul_(1 - lr * decay)
                m.mul_(beta1).add_(grad, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                nesterov = grad.mul(1 - beta1).add_(m, alpha=beta1)
                denom = (v.sqrt() / math.sqrt(1 - beta2**t)).add_(eps)
                p.addcdiv_(nesterov, denom, value=-lr / (1 - beta1**t))
        return loss
