"""The settings a user's own LightningModule (``model=lightning``) owns: its optimizer and its
learning-rate schedule, which its ``configure_optimizers`` builds from its own arguments.

tuneup's ``optimizer.*`` and ``scheduler.*`` are read by tuneup's training step alone
(trainer/module.py ``TrainingModule.configure_optimizers``); for such a module they would train
exactly as without them. So, as for any key nothing reads, a single run refuses them when the
command line gives them, so does a sweep whose every job trains the module (:class:`SweepCheck`),
and a search does not sample them (tuneup/optuna/unread.py),
in one line that says where the module's own settings go: its arguments, ``model.lr=...``.
``optimizer.clip_grad_norm`` has its own line (trainer/checks.py ``clip_problems``), and an
optimizer that is a plugin (muon, schedulefree, lamb, lars) refuses itself in its ``check``.
"""

from __future__ import annotations

import inspect
import sys

from hydra.experimental.callback import Callback

#: The groups the module's ``configure_optimizers`` replaces.
OWNED = ("optimizer", "scheduler")
#: Overrides that choose the model: swept, a sweep trains other models than the first.
MODEL_CHOICES = ("model", "model._target_", "experiment")
#: Keys of those groups with a line of their own.
OWN_LINE = ("optimizer.clip_grad_norm",)


def owned(key: str) -> bool:
    """Whether ``key`` (an override's key, ``+``/``~`` allowed) is a setting the module owns."""
    key = key.lstrip("+~")
    return key.split(".")[0] in OWNED and key not in OWN_LINE


def own_settings_problems(cfg, plan, given: list[str]) -> list[str]:
    """One problem naming the overrides in ``given`` (the command line's) that the
    LightningModule of ``plan`` owns, or none."""
    if not plan.lightning:
        return []
    found = [o for o in given if owned(o.split("=", 1)[0])]
    if cfg.optimizer.get("plugin"):  # its plugin's check refuses it, with its own advice
        found = [o for o in found if not o.lstrip("+~").startswith("optimizer")]
    if not found:
        return []
    verb = "does" if len(found) == 1 else "do"
    return [
        f"{' '.join(found)} {verb} nothing with model=lightning: {plan.model_name} builds "
        f"its own optimizer and schedule in its configure_optimizers; "
        f"{where_settings_go(plan, found)}"
    ]


#: What Lightning needs a LightningModule to define to train it (its configuration validator).
TRAINING_HOOKS = ("training_step", "configure_optimizers")


def missing_hook_problems(cfg, plan) -> list[str]:
    """A LightningModule without ``training_step`` or ``configure_optimizers`` cannot train:
    said before anything is built (Lightning would say it once the run has started, and
    tuneup does not lend it its own optimizer: the module's loop is its own)."""
    if cfg.get("mode", "fit") != "fit" or not plan.lightning:
        return []
    import pytorch_lightning as pl

    target = plan.model_target
    module = target if inspect.isclass(target) else type(plan.meta_model())
    missing = [
        h for h in TRAINING_HOOKS if getattr(module, h, None) is getattr(pl.LightningModule, h)
    ]
    if not missing:
        return []
    return [
        f"model=lightning: {plan.model_name} defines no {' and no '.join(missing)}, which "
        f"Lightning needs to train it ({'; '.join(HOOK_ROLES[h] for h in missing)}); define "
        f"{'them' if len(missing) > 1 else 'it'}, or evaluate a checkpoint without training: "
        "mode=validate resume=<checkpoint>"
    ]


#: What each of :data:`TRAINING_HOOKS` does, for the line that says one is missing.
HOOK_ROLES = {
    "training_step": "training_step(self, batch, batch_idx) returns the batch's loss",
    "configure_optimizers": "configure_optimizers builds its optimizer from its own arguments, "
    "e.g. torch.optim.AdamW(self.parameters(), lr=self.lr)",
}


def where_settings_go(plan, overrides: list[str]) -> str:
    """Where the module's own settings go: ``model.lr=<the value given>`` where it takes
    ``lr``, else its arguments by name."""
    names = argument_names(plan.model_target)
    lr = next(
        (o.split("=", 1)[1] for o in overrides if o.lstrip("+~").startswith("optimizer.lr=")), None
    )
    if "lr" in names:
        return (
            f"set its own arguments instead (it takes: {', '.join(names)}), e.g. "
            f"model.lr={lr if lr is not None else '...'}"
        )
    if names:
        return f"set its own arguments instead (it takes: {', '.join(names)}), model.<argument>=..."
    return "its __init__ takes no arguments: change its configure_optimizers"


def argument_names(target) -> list[str]:
    """The named arguments of ``target`` (a class: its ``__init__``'s), in order."""
    try:
        parameters = inspect.signature(target).parameters.values()
    except (TypeError, ValueError):
        return []
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [p.name for p in parameters if p.kind in kinds]


class SweepCheck(Callback):
    """A Hydra callback: a sweep (``-m``) whose jobs all train a user's LightningModule
    (``model=lightning`` fixed) and whose command line gives tuneup's ``optimizer.*`` or
    ``scheduler.*`` is refused before its first job, in the single run's line: every job would
    train the same. Where ``model`` itself is swept, the other models read them."""

    def on_multirun_start(self, config, **kwargs) -> None:
        from hydra.core.override_parser.overrides_parser import OverridesParser

        from tuneup.trainer.components import Plan

        given = list(config.hydra.overrides.task)
        if not any(owned(o.split("=", 1)[0]) for o in given):
            return
        for override in OverridesParser.create().parse_overrides(given):
            key = override.key_or_group.lstrip("+~")
            if override.is_sweep_override() and key in MODEL_CHOICES:
                return  # the config here has the first model alone: the others may read them
        found = own_settings_problems(config, Plan(config), given)
        if found:
            print(f"error: {found[0]}", file=sys.stderr)
            sys.exit(1)
