"""Optimizers and learning-rate schedules, by the names in ``conf/optimizer`` and ``conf/scheduler``.

A plugin can supply its own optimizer through the ``configure_optimizer``
hook; these are what the core builds when none does (``muon`` and ``schedulefree`` are
plugins: plugins/muon.py, plugins/schedulefree.py). Schedules step once per
optimizer step (Lightning's ``interval: step``), not per micro-batch. docs/optimizers.md
says when each pays.
"""

from __future__ import annotations

import math

import torch

from tuneup.trainer.nadamw import NAdamW
from tuneup.trainer.validation import BOOL, Integer, Number, OneOf, problems

OPTIMIZERS = ("sgd", "adamw", "nadamw")
SCHEDULERS = ("constant", "cosine", "wsd")
DECAY_SHAPES = ("linear", "cosine", "sqrt")

RULES = {
    "optimizer.name": OneOf(OPTIMIZERS),
    "optimizer.lr": Number(gt=0),
    "optimizer.weight_decay": Number(ge=0),
    "optimizer.momentum": Number(ge=0, lt=1),
    "optimizer.nesterov": BOOL,
    "optimizer.eps": Number(gt=0),
    "optimizer.clip_grad_norm": Number(gt=0, also=(None,)),
    "scheduler.name": OneOf(SCHEDULERS),
    "scheduler.warmup_steps": Integer(low=0),
    "scheduler.min_lr_ratio": Number(ge=0, le=1),
    "scheduler.decay_fraction": Number(ge=0, le=1),
    "scheduler.decay_shape": OneOf(DECAY_SHAPES),
}


def check_optim(cfg) -> list[str]:
    if cfg.optimizer.get("plugin"):  # a plugin's optimizer (e.g. lamb): the plugin checks it
        shared = ("scheduler.", "optimizer.clip_grad_norm")
        return problems(cfg, {k: v for k, v in RULES.items() if k.startswith(shared)})
    found = problems(cfg, RULES)
    o = cfg.optimizer
    if not found and o.name == "sgd" and o.get("nesterov") and o.get("momentum") == 0:
        found.append(
            "optimizer.momentum=0.0 with optimizer.nesterov=true: Nesterov momentum needs "
            "momentum > 0; set optimizer.momentum (e.g. 0.9) or optimizer.nesterov=false"
        )
    return found


def build_optimizer(cfg, params) -> torch.optim.Optimizer:
    o = cfg.optimizer
    if o.name == "sgd":
        return torch.optim.SGD(
            params, lr=o.lr, momentum=o.momentum, weight_decay=o.weight_decay, nesterov=o.nesterov
        )
    betas = tuple(o.get("betas", (0.9, 0.999)))
    if o.name == "nadamw":
        return NAdamW(params, lr=o.lr, betas=betas, eps=o.eps, weight_decay=o.weight_decay)
    return torch.optim.AdamW(params, lr=o.lr, betas=betas, eps=o.eps, weight_decay=o.weight_decay)


def build_scheduler(cfg, optimizer, total_steps: int):
    """A LambdaLR: linear warm-up, then constant, cosine decay to ``min_lr_ratio``, or
    warm-up-stable-decay (:func:`wsd_factor`)."""
    s = cfg.scheduler  # read once: the factor runs every optimizer step
    warmup, floor, name = s.get("warmup_steps", 0), s.get("min_lr_ratio", 0.0), s.name
    if name == "wsd":
        return torch.optim.lr_scheduler.LambdaLR(
            optimizer,
            wsd_factor(
                warmup, s.decay_fraction, floor, s.get("decay_shape", "linear"), total_steps
            ),
        )

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if name == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def wsd_factor(warmup: int, decay_fraction: float, floor: float, shape: str, total_steps: int):
    """Warm-up-stable-decay (trapezoidal): the factor of step ``step`` (0-based) is
    ``(step + 1) / warmup`` during the warm-up, 1 until the last ``round(decay_fraction x
    total_steps)`` steps (never before the warm-up ends: ``start``), then falls toward
    ``floor`` (reached after the last step, as cosine's) along ``shape``: with
    ``p = (step - start) / (total_steps - start)``, ``linear`` 1 - p,
    ``cosine`` (1 + cos(pi p)) / 2, ``sqrt`` 1 - sqrt(p) (Hägele et al. 2024's "1-sqrt")."""
    start = max(warmup, total_steps - round(decay_fraction * total_steps))
    length = total_steps - start
    shapes = {
        "linear": lambda p: 1 - p,
        "sqrt": lambda p: 1 - math.sqrt(p),
        "cosine": lambda p: 0.5 * (1 + math.cos(math.pi * p)),
    }
    fall = shapes[shape]

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if step < start or length <= 0:
            return 1.0
        progress = min(1.0, (step - start) / length)  # as cosine: floor after the last step
        return floor + (1 - floor) * fall(progress)

    return factor


def set_lr_from_schedule(scheduler) -> None:
    """Set each group's learning rate to what ``scheduler`` gives at its current step.

    A resumed run restores the learning rate the old run's schedule computed; with a
    changed schedule, limit or base rate, the new one applies from the resumed step on, not
    one step later. For an unchanged run it computes the very value restored (LambdaLR's
    own closed form, ``base_lr x factor(step)``), so exact resume stays exact. Other
    schedulers are left as restored.
    """
    if not isinstance(scheduler, torch.optim.lr_scheduler.LambdaLR):
        return
    step = scheduler.last_epoch
    for group, base, factor in zip(
        scheduler.optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas, strict=True
    ):
        group["lr"] = base * factor(step)
