"""The optimizer family of the time-to-target study's default space (docs/autotune.md).

Your optimizer, ``muon``, ``schedulefree`` and ``nadamw``, as one choice ``optimizer`` of the
space, each with its own learning-rate range, sampled only where it is the choice
(``optimizer.lr@muon``: study/space.py's per-choice keys). Whether a member applies here is
not decided in this module: build_space composes and checks each as its job would be (muon's
check refuses a model with no hidden ``nn.Linear`` and ``strategy=fsdp``; schedulefree's
refuses any schedule but ``scheduler=constant``, so the space runs it with that one; a member
whose package or config this install lacks does not compose), and one that is refused is left
out of the space with the check's reason.

The ranges: learning rates are not on one scale across optimizers. Adam's update moves each
weight by about ``lr`` whatever the gradient's size, so ``adamw``, ``nadamw``, ``lamb`` and
schedule-free AdamW share a scale: a member's range is centred on your ``lr`` times the ratio
of the two optimizers' defaults in conf/optimizer/ (schedulefree's default 2.5e-3 is 2.5x
AdamW's 1e-3: Defazio et al. 2024 run schedule-free AdamW at 1x to 10x a scheduled AdamW's
rate; nadamw's is AdamW's, as AlgoPerf's baseline uses it). Muon's ``lr`` is its own scale
(the orthogonalised update's size per matrix, scaled by ``adjust_lr_fn``), and SGD's is the
gradient's: from an optimizer of another scale a member is centred on its own default. Every
range spans the centre / 10 to the centre x 30, as your own learning rate's does: the defaults
are set for long runs of large models, and the short races' best rates lie above them
(docs/optimizers.md: muon's best on digits is 10x to 25x its default 0.02).
"""

from __future__ import annotations

import math

from omegaconf import OmegaConf

MEMBERS = ("muon", "schedulefree", "nadamw")
ADAM_SCALE = frozenset({"adamw", "nadamw", "lamb", "schedulefree"})


def lr_range(lr: float) -> str:
    """A learning rate's range around ``lr``, log-uniform from lr / 10 to lr x 30."""
    return f"tag(log, interval({num(lr / 10)}, {num(lr * 30)}))"


def family_params(optimizer, lr: float, warmup_steps: int | None = None) -> dict[str, str]:
    """The ``optimizer`` choice and each member's range (``optimizer.lr@<member>``), around
    your optimizer (``optimizer``: its config node) and its ``lr``. Empty when your optimizer
    has no name (then only your learning rate is searched)."""
    mine = optimizer.get("name")
    if not isinstance(mine, str):
        return {}
    members = [mine, *(m for m in MEMBERS if m != mine)]
    found = {"optimizer": f"choice({', '.join(members)})", f"optimizer.lr@{mine}": lr_range(lr)}
    for member in members[1:]:
        centre = member_lr(member, mine, lr)
        if centre:
            found[f"optimizer.lr@{member}"] = lr_range(centre)
    if warmup_steps and mine != "schedulefree":  # its own warm-up: it takes no schedule's
        found["optimizer.warmup_steps@schedulefree"] = f"range(0, {max(1, int(warmup_steps)) + 1})"
    return found


def member_lr(member: str, mine: str, lr: float) -> float | None:
    """The centre of ``member``'s range: on your optimizer's scale where both are Adam's,
    else the member's own default (None: this install has no config for it)."""
    theirs, yours = default_lr(member), default_lr(mine)
    if theirs is None:
        return None
    if member in ADAM_SCALE and mine in ADAM_SCALE and yours:
        return lr * theirs / yours
    return theirs


def default_lr(name: str) -> float | None:
    """An optimizer's ``lr`` in its built-in config (conf/optimizer/<name>.yaml)."""
    from tuneup.trainer.config import builtin_dir

    path = builtin_dir() / "optimizer" / f"{name}.yaml"
    if not path.is_file():
        return None
    lr = OmegaConf.load(path).get("lr")
    return float(lr) if isinstance(lr, int | float) and lr > 0 else None


def num(value: float) -> str:
    """A short float for the space's text (3 significant digits)."""
    if value == 0 or not math.isfinite(value):
        return repr(float(value))
    return f"{value:.3g}" if "e" not in f"{value:.3g}" else repr(float(f"{value:.3g}"))
