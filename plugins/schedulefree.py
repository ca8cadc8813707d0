"""Schedule-free AdamW (Defazio et al. 2024, the ``schedulefree`` package): ``optimizer=schedulefree``.

No learning-rate schedule: the optimizer keeps ``z`` (the base iterate of its SGD-like steps)
and trains at ``y``, an interpolation between ``z`` and ``x``, the running average that is the
model to evaluate. It needs to know which of the two the weights in the model are:
``optimizer.train()`` puts ``y`` there, ``optimizer.eval()`` puts ``x``.

Here the model holds ``x``, the evaluation weights, everywhere but inside a training step:
the optimizer is switched to ``train()`` when a micro-batch starts (before its forward) and
back to ``eval()`` right after each optimizer step (:class:`ScheduleFreeAdamW`; and at the
batch's end, should a loss scaler have skipped the step). So every reader of the weights
between steps sees ``x``: validation (and ``tta``), ``ema`` (which averages ``x``), every
checkpoint (``last``, ``best.ckpt``, sharded or not, so ``consolidate`` too), the Hugging Face
export, the summary's final figures. The checkpoint's optimizer state holds ``z`` and the
groups' ``train_mode=False``: a resumed run switches to ``train()`` at its first micro-batch
as the uninterrupted one did after the save, so resume is bit-exact. The cost: two passes
over the weights (a ``lerp`` each) per optimizer step, and the trajectory differs from the
package's own loop (which switches only at evaluations) by the round-off of ``x <-> y``.

It brings its own linear warm-up (``optimizer.warmup_steps``) and takes no schedule:
``scheduler=constant`` (without warm-up) is the only one allowed. Give it on the command line
(``optimizer=schedulefree scheduler=constant``): a config group cannot change another group's
default that comes after it in conf/config.yaml (Hydra refuses the override), and turning the
default cosine into a constant schedule silently would hide the user's choice.
"""

from __future__ import annotations

import torch

try:
    import schedulefree
except ImportError as error:  # the extra is not installed
    raise ImportError(
        f"{error}: optimizer=schedulefree needs pip install 'tuneup[schedulefree]'"
    ) from error

from tuneup import hookimpl
from tuneup.trainer.validation import Integer, Number, problems

RULES = {
    "optimizer.lr": Number(gt=0),
    "optimizer.eps": Number(gt=0),
    "optimizer.weight_decay": Number(ge=0),
    "optimizer.warmup_steps": Integer(low=0),
    "optimizer.r": Number(ge=0),
    "optimizer.weight_lr_power": Number(ge=0),
}


class ScheduleFreeAdamW(schedulefree.AdamWScheduleFree):
    """``AdamWScheduleFree`` that trains at ``y`` and leaves ``x`` in the model after each step."""

    #: Entries of its param groups that are state, not settings: a resume keeps the saved ones
    #: (trainer/state/changes.py ``adopt_optimizer_settings``).
    group_state_keys = ("k", "train_mode", "weight_sum", "lr_max", "scheduled_lr")

    @torch.no_grad()
    def step(self, closure=None):
        self.train()  # a closure (Lightning's forward and backward) runs at y
        loss = super().step(closure)
        self.eval()
        return loss


def build(cfg, params) -> ScheduleFreeAdamW:
    o = cfg.optimizer
    return ScheduleFreeAdamW(
        params,
        lr=o.lr,
        betas=tuple(o.betas),
        eps=o.eps,
        weight_decay=o.weight_decay,
        warmup_steps=o.warmup_steps,
        r=o.r,
        weight_lr_power=o.weight_lr_power,
    )


def schedule_problems(cfg) -> list[str]:
    s = cfg.get("scheduler") or {}
    if s.get("name") != "constant":
        return [
            f"scheduler={s.get('name')} cannot be used with optimizer=schedulefree: it needs "
            "no schedule (its own warm-up is optimizer.warmup_steps); use scheduler=constant"
        ]
    if s.get("warmup_steps", 0):
        return [
            f"scheduler.warmup_steps={s.warmup_steps} cannot be used with "
            "optimizer=schedulefree: set optimizer.warmup_steps instead and "
            "scheduler.warmup_steps=0"
        ]
    return []


class Plugin:
    def __init__(self) -> None:
        self.optimizer: ScheduleFreeAdamW | None = None

    @hookimpl
    def check(self, cfg, plan):
        found = problems(cfg, RULES) + schedule_problems(cfg)
        betas = cfg.optimizer.get("betas")
        if betas is not None and not (
            len(betas) == 2 and all(isinstance(b, int | float) and 0 < b < 1 for b in betas)
        ):
            found.append(
                f"optimizer.betas={list(betas)} is not allowed: expected two numbers "
                "in (0, 1), e.g. [0.9, 0.999]"
            )
        if plan is not None and plan.lightning:
            found.append(
                f"optimizer=schedulefree cannot apply to model=lightning: the LightningModule "
                f"{plan.model_name} builds its own optimizer in configure_optimizers; use "
                "schedulefree.AdamWScheduleFree there (with its train()/eval()), or remove "
                "optimizer="
            )
        return found

    @hookimpl
    def configure_optimizer(self, cfg, params):
        self.optimizer = build(cfg, params)
        return self.optimizer

    @hookimpl(tryfirst=True)
    def on_train_batch_start(self):
        if self.optimizer is not None:
            self.optimizer.train()

    @hookimpl(tryfirst=True)
    def on_train_batch_end(self):  # before the checkpoint and ema: a skipped step left y
        if self.optimizer is not None:
            self.optimizer.eval()

    @hookimpl(tryfirst=True)
    def on_validation_start(self):
        if self.optimizer is not None:
            self.optimizer.eval()

    @hookimpl(tryfirst=True)
    def on_exception(self):
        if self.optimizer is not None:
            self.optimizer.eval()

    def describe(self) -> dict:
        return {
            "weights_between_steps": "x (optimizer.eval()): validated, checkpointed, exported",
            "train_at": "y (optimizer.train()), from each micro-batch's start "
            "to its optimizer step",
        }

    @hookimpl
    def report(self, summary):
        if self.optimizer is not None:
            group = self.optimizer.param_groups[0]
            summary["optimizer"] = {
                "implementation": "schedulefree.AdamWScheduleFree",
                "lr_max": group["lr_max"],
                "k": group["k"],
            }
