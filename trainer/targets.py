"""The user's own code named by ``_target_``: found, imported, called with its arguments.

``model=custom model._target_=pkg.Net`` and ``data=custom data._target_=pkg.DM`` name a
class or function by its dotted path; :func:`locate` imports it (an error names the module
and what it has), :func:`arguments` are the node's other keys.
"""

from __future__ import annotations

import importlib
import inspect

from tuneup.errors import TuneupError

TARGET = "_target_"
#: Keys of ``data`` that are tuneup's own, not arguments of a data target.
DATA_KEYS = ("batch_size",)


def is_user(node) -> bool:
    """Whether a ``model`` or ``data`` node names the user's own code (``_target_``), or is
    meant to and does not yet (``model=custom`` without ``model._target_``: ``???``)."""
    from omegaconf import OmegaConf

    return node is not None and (TARGET in node or OmegaConf.is_missing(node, TARGET))


def chose_lightning(node) -> bool:
    """Whether the user picked ``model=lightning`` (not ``model=custom``) for ``node``: its
    node is otherwise ``model=custom``'s, and Hydra's choices are not known to an in-process
    compose, so the node carries a flag (``_tuneup/lightning``, trainer/config.py)."""
    from tuneup.trainer.config import LIGHTNING_FLAG

    return bool(node is not None and node._get_flag(LIGHTNING_FLAG))


#: What to say when ``model=custom|lightning`` or ``data=custom`` comes without ``_target_``.
MISSING_TARGET = {
    "model": "model._target_ is not set: your own model needs the dotted path of its class "
    "(or of a function returning it), e.g. model._target_=my_project.nets.Net",
    "data": "data._target_ is not set: your own data needs the dotted path of its "
    "LightningDataModule (or of a function returning Datasets), e.g. "
    "data._target_=my_project.data.MyData",
}


def target_path(node, group: str) -> str:
    """The ``_target_`` of the user's ``model`` or ``data`` node; TuneupError when not given."""
    from omegaconf import OmegaConf

    if OmegaConf.is_missing(node, TARGET):
        raise TuneupError(MISSING_TARGET[group] + _mistyped_target(node, group))
    return str(node[TARGET])


def _mistyped_target(node, group: str) -> str:
    """``model._targt_=pkg.Net`` is taken as an argument of the model (any key beside
    ``_target_`` is one), so the error names the key that was most likely meant as it."""
    from tuneup.trainer.typos import did_you_mean

    for key in node:
        if key != TARGET and did_you_mean(str(key), [TARGET]) == TARGET:
            return (
                f"; did you mean {group}.{TARGET}={node[key]} instead of {group}.{key}={node[key]}?"
            )
    return ""


def arguments(node, drop=()) -> dict:
    """The keys beside ``_target_`` of ``node``, as plain Python values."""
    from omegaconf import OmegaConf

    values = OmegaConf.to_container(node, resolve=True)
    return {k: v for k, v in values.items() if k != TARGET and k not in drop}


def locate(path: str, key: str):
    """The object at dotted ``path`` (a class or function); TuneupError saying why not.

    The longest importable module prefix is imported and the rest looked up as attributes,
    so a typo names the module and what it has, and an error raised while importing the
    user's module is shown as that error.
    """
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        module_name = ".".join(parts[:i])
        try:
            obj = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and (module_name + ".").startswith(exc.name + "."):
                continue  # this prefix is not a module: look the rest up as attributes
            raise _cannot_import(key, path, exc) from exc
        except Exception as exc:  # the user's module raised while being imported
            raise _cannot_import(key, path, exc) from exc
        for depth, attr in enumerate(parts[i:], start=i):
            if not hasattr(obj, attr):
                owner = ".".join(parts[:depth])
                names = sorted(n for n in dir(obj) if not n.startswith("_"))[:12]
                raise TuneupError(
                    f"{key}={path!r}: {owner} has no attribute {attr!r} "
                    f"(it has: {', '.join(names) or 'nothing public'})"
                )
            obj = getattr(obj, attr)
        return obj
    raise TuneupError(
        f"{key}={path!r}: no module {parts[0]!r} can be imported; give the dotted path of a "
        "class or function importable from the current directory or an installed package"
    )


def _cannot_import(key: str, path: str, exc: Exception) -> TuneupError:
    return TuneupError(f"{key}={path!r} cannot be imported: {type(exc).__name__}: {exc}")


def accepts(target, name: str) -> bool:
    """Whether calling ``target`` takes a keyword argument ``name``."""
    try:
        parameters = inspect.signature(target).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == name or p.kind is p.VAR_KEYWORD for p in parameters)
