"""Optimizers and learning-rate schedules, by the names in ``conf/optimizer`` and ``conf/scheduler``.

A plugin can supply its own optimizer through the ``configure_optimizer``
hook; these are what the core builds when none does. Schedules step once per
optimizer step (Lightning's ``interval: step``), not per micro-batch.
"""

from __future__ import annotations

import math

import torch

from tuneup.trainer.validation import BOOL, Integer, Number, OneOf, problems

OPTIMIZERS = ("sgd", "adamw")
SCHEDULERS = ("constant", "cosine")

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
    return torch.optim.AdamW(params, lr=o.lr, betas=betas, eps=o.eps, weight_decay=o.weight_decay)


def build_scheduler(cfg, optimizer, total_steps: int):
    """A LambdaLR: linear warm-up, then constant or cosine decay to ``min_lr_ratio``."""
    s = cfg.scheduler  # read once: the factor runs every optimizer step
    warmup, floor, constant = (
        s.get("warmup_steps", 0),
        s.get("min_lr_ratio", 0.0),
        s.name == "constant",
    )

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if constant:
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


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
