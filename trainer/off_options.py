"""Settings given to a built-in plugin that is off: inert, and said so (``ema=off ema.decay=0.9``).

A group's ``off`` option leaves its plugin out and carries every setting of the group's other
options, with their defaults, so that a setting composes with it: a sweep's ``-m ema=off,on
ema.decay=0.9`` runs both, the setting read where the plugin is on. Where it is off, a value
other than the off option's own is read by nothing: the checks warn (:func:`inert_settings`,
trainer/checks.py) and name the options that switch the plugin on
(:func:`options_switching_on`). The option files are read from the built-in configs
(:func:`tuneup.trainer.config.builtin_dir`), each parsed once while it is unchanged.
"""

from __future__ import annotations

import functools
from pathlib import Path

from omegaconf import OmegaConf

from tuneup.trainer.config import _is_global, builtin_dir

#: The option that leaves a group's plugin out, with every setting of the group's other options
#: (tests/test_config_errors.py holds each built-in group to it).
OFF = "off"


def plugin_is_off(cfg, group: str) -> bool:
    """Whether ``group`` is a built-in group with an ``off`` option, chosen in ``cfg``."""
    node = cfg.get(group)
    return (
        (builtin_dir() / group / f"{OFF}.yaml").is_file()
        and OmegaConf.is_dict(node)
        and "plugin" not in node
        and node.get("name") == OFF
    )


def options_switching_on(group: str) -> list[str]:
    """The built-in options of ``group`` that switch its plugin on (``ema``: ``on``)."""
    found = []
    for path in sorted((builtin_dir() / group).glob("*.yaml")):
        node = _option_node(path, group)
        if OmegaConf.is_dict(node) and "plugin" in node:
            found.append(path.stem)
    return found


def off_defaults(group: str) -> dict:
    """The settings the ``off`` option of a built-in group carries, with their values."""
    node = _option_node(builtin_dir() / group / f"{OFF}.yaml", group)
    return OmegaConf.to_container(node) if OmegaConf.is_dict(node) else {}


def _option_node(path: Path, group: str):
    """What an option file gives its group's node (a ``_global_`` file: its ``group`` key).
    Read-only: the parsed file is shared by every call while the file is unchanged."""
    stat = path.stat()
    loaded, is_global = _read_option(str(path), stat.st_mtime_ns, stat.st_size)
    return loaded.get(group) if is_global else loaded


@functools.lru_cache(maxsize=256)
def _read_option(path: str, _mtime_ns: int, _size: int) -> tuple:
    """An option file parsed once while it is unchanged (its path, time and size): the checks
    of every run, and of every job a sweep composes, read each ``off`` option
    (:func:`inert_settings`), and OmegaConf parses YAML slowly."""
    loaded = OmegaConf.load(path)
    OmegaConf.set_readonly(loaded, True)
    return loaded, _is_global(Path(path))


def inert_settings(cfg) -> list[tuple[str, str, object]]:
    """(group, key, value) of each setting given to a built-in plugin that is off
    (``ema=off ema.decay=0.9``): a value other than the off option's own, which nothing reads."""
    found = []
    for path in sorted(builtin_dir().glob(f"*/{OFF}.yaml")):
        group = path.parent.name
        if not plugin_is_off(cfg, group):
            continue
        own, given = off_defaults(group), OmegaConf.to_container(cfg[group])
        found += [(group, k, v) for k, v in given.items() if k in own and v != own[k]]
    return found
