"""Keys of a search space that nothing reads, found before any trial runs.

A trial's values are overrides of one run; where nothing reads one, every trial trains the
same and the study's best parameters would still name it as part of the answer. So, as a
single run refuses such a key (trainer/unread_keys.py), the sweeper refuses it before the first
job, in one line:

- ``model.<key>`` that the model does not take: not a setting of a built-in model
  (``model=mlp model.lr=...``), not an argument of the user's own ``model._target_``;
- ``optimizer.*`` and ``scheduler.*`` for a user's LightningModule, which builds its own
  optimizer and schedule (trainer/own_optimizer.py): its own arguments are what to search.

tuneup's default space (conf/hparams_search/optuna.yaml, left as it is) searches
``optimizer.lr`` and ``optimizer.weight_decay``; for a LightningModule :func:`fit_space` leaves
them out and searches the module's own ``model.lr`` over ``optimizer.lr``'s interval where it
takes an ``lr`` argument, saying so in the log.
"""

from __future__ import annotations

import logging

from tuneup import TuneupError
from tuneup.optuna.space import Space, parse_space
from tuneup.trainer.own_optimizer import argument_names, own_settings_problems, owned
from tuneup.trainer.targets import TARGET, accepts

log = logging.getLogger(__name__)

#: The model argument searched in place of tuneup's learning rate, where the module takes it.
OWN_LR = "model.lr"


def fit_space(space: Space, lines: dict[str, str], cfg, plan) -> Space:
    """``space`` without what nothing reads in a trial of ``cfg`` (``plan``: what it trains):
    tuneup's default keys a LightningModule owns are replaced by its ``model.lr`` or left out;
    a key the user gave that nothing reads is a TuneupError. ``lines``: each key's
    ``key=value`` as given (hydra.sweeper.params then the command line)."""
    keys = [k.lstrip("+~") for k in (*space.distributions, *space.fixed)]
    found = _model_key_problems(cfg, plan, keys)
    if plan.lightning:
        default = default_params()
        mine = [k for k in keys if owned(k) and default.get(k) != lines[k].split("=", 1)[1]]
        found += own_settings_problems(cfg, plan, [lines[k] for k in mine])
        if not found:
            space = _without_tuneups_optimizer(space, lines, plan, default)
    if found:
        raise TuneupError("; ".join(found))
    return space


def _without_tuneups_optimizer(space: Space, lines: dict, plan, default: dict) -> Space:
    """The default space's ``optimizer.*`` out; ``model.lr`` in, where the module takes it."""
    dropped = [k for k in (*space.distributions, *space.fixed) if owned(k.lstrip("+~"))]
    if not dropped:
        return space
    for key in dropped:
        space.distributions.pop(key, None)
        space.fixed.pop(key, None)
    said = f"model=lightning: {plan.model_name} builds its own optimizer and schedule"
    takes = argument_names(plan.model_target)
    if "lr" in takes and OWN_LR not in lines:
        (searched,) = parse_space({OWN_LR: default["optimizer.lr"]}, []).distributions.values()
        space.distributions = {OWN_LR: searched, **space.distributions}
        log.info(
            "optuna: %s: the search samples its argument %s=%s in place of %s",
            said,
            OWN_LR,
            default["optimizer.lr"],
            ", ".join(dropped),
        )
    else:
        log.info(
            "optuna: %s: the search leaves %s out; search its own arguments with "
            "model.<argument>=... (it takes: %s)",
            said,
            ", ".join(dropped),
            ", ".join(takes) or "none",
        )
    return space


def _model_key_problems(cfg, plan, keys: list[str]) -> list[str]:
    """The space's keys that are no setting (trainer/unread_keys.py), and its ``model.<key>`` that
    the user's own model does not take as an argument."""
    from tuneup.trainer.unread_keys import unread_key_problems

    found = unread_key_problems(cfg, keys)
    wanted = [k for k in keys if k.startswith("model.")]
    if not (wanted and plan.user_model):
        return found
    try:
        target = plan.model_target
    except TuneupError:
        return found  # each trial's check says why the target cannot be imported
    for key in wanted:
        name = key.split(".")[1]
        if name != TARGET and not accepts(target, name):
            takes = ", ".join(argument_names(target)) or "none"
            found.append(
                f"{key} is not an argument of model {plan.model_name} (it takes: "
                f"{takes}); nothing would read it"
            )
    return found


def default_params() -> dict[str, str]:
    """tuneup's default search space: conf/hparams_search/optuna.yaml's params."""
    import yaml

    from tuneup.trainer.config import builtin_dir

    preset = yaml.safe_load((builtin_dir() / "hparams_search" / "optuna.yaml").read_text())
    params = ((preset.get("hydra") or {}).get("sweeper") or {}).get("params") or {}
    return {str(k): str(v) for k, v in params.items()}


def given_lines(params: dict | None, arguments: list[str]) -> dict[str, str]:
    """Each key's ``key=value`` as the space reads it (a later one wins, as in parse_space)."""
    lines = [f"{key}={value}" for key, value in (params or {}).items()] + list(arguments)
    return {line.split("=", 1)[0].lstrip("+~"): line for line in lines}
