"""Lightning callbacks of the user's choosing, from the config (``callbacks:`` in conf/config.yaml).

A Lightning user brings callbacks (``EarlyStopping``, ``LearningRateMonitor``, their own) the
way Lightning's CLI takes them: a ``_target_`` class path and its arguments, built with
Hydra's ``instantiate``. The config holds them by name, a dict (Hydra merges dicts from
presets and the command line; a list can only be replaced whole)::

    tuneup '+callbacks.stop={_target_: pytorch_lightning.callbacks.EarlyStopping,
                             monitor: val/loss, patience: 2}'

A list of such nodes is taken too. Each is checked before anything is built: the class must
import and be a Lightning ``Callback``; a bad argument is named with the callback's key.
"""

from __future__ import annotations

import pytorch_lightning as pl
from omegaconf import OmegaConf

from tuneup.errors import TuneupError
from tuneup.trainer.targets import locate


def nodes(cfg) -> list[tuple[str, object]]:
    """(key, node) for every callback the config names, in order."""
    given = cfg.get("callbacks")
    if given is None:
        return []
    if OmegaConf.is_list(given):
        return [(f"callbacks[{i}]", node) for i, node in enumerate(given)]
    if OmegaConf.is_dict(given):
        return [(f"callbacks.{name}", node) for name, node in given.items() if node is not None]
    return [("callbacks", given)]


def problems(cfg) -> list[str]:
    """What is wrong with ``callbacks:``, one line each, before anything is built."""
    found = []
    for key, node in nodes(cfg):
        target = node.get("_target_") if OmegaConf.is_dict(node) else None
        if not isinstance(target, str):
            found.append(
                f"{key}={node!r} is not allowed: expected a node with a _target_ "
                "(a Lightning Callback class path) and its arguments"
            )
            continue
        try:
            cls = locate(target, f"{key}._target_")
        except TuneupError as exc:
            found.append(str(exc))
            continue
        if not (isinstance(cls, type) and issubclass(cls, pl.Callback)):
            found.append(
                f"{key}._target_={target} is not allowed: expected a subclass of "
                "pytorch_lightning.Callback"
            )
    return found


def build(cfg) -> list[pl.Callback]:
    """The configured callbacks, instantiated; an argument the class refuses is one line."""
    from hydra.utils import instantiate

    made = []
    for key, node in nodes(cfg):
        try:
            made.append(instantiate(node, _convert_="all"))
        except Exception as exc:  # Hydra wraps the class's own TypeError/ValueError
            cause = exc.__cause__ or exc
            raise TuneupError(f"{key}: {node._target_} could not be made: {cause}") from exc
    return made
