"""Keys nothing reads: a key added with Hydra's ``+`` that no config gives (``+precison=bf16``,
``+optimizer.lrr=0.1``, ``+precision.init_scal=1024``) would be accepted and silently train the
default, so the run's checks refuse it, naming the key most likely meant.

What counts as read is what the config files give: conf/config.yaml's keys and nodes, each
built-in option's keys, the groups and presets of every searched config folder, and the names
interpolations use. A sweep's keys are checked the same way (:func:`unread_key_problems`).
The other checks of the core's keys are in checks.py.
"""

from __future__ import annotations

import functools
import re

from omegaconf import DictConfig, OmegaConf

from tuneup.trainer.typos import did_you_mean

#: Groups whose built-in options list every key they read: a key added with + is a typo.
CLOSED_GROUPS = ("model", "data", "optimizer", "scheduler")


#: Nodes of conf/config.yaml itself that hold every key they read.
CLOSED_NODES = ("measure", "grad_accum", "plugins", "report")


def problems(cfg) -> list[str]:
    """Keys nothing reads, added with Hydra's ``+`` (``+precison=bf16``, ``+optimizer.lrr=0.1``):
    they would be accepted and silently do nothing. At the top level, under conf/config.yaml's
    own nodes, and under a built-in option of a closed group. (``trainer.*``: Lightning's
    signature, checks.py; a plugin's group: its own check.)"""
    from tuneup.trainer.config import builtin_dir

    found = _unknown_top_level(cfg)
    primary = _yaml(builtin_dir() / "config.yaml")
    for name in CLOSED_NODES:
        node, allowed = cfg.get(name), set(primary.get(name) or {})
        if isinstance(node, DictConfig):
            for key in sorted(set(node) - allowed):
                match = did_you_mean(key, allowed)
                hint = f"; did you mean {name}.{match}?" if match else ""
                found.append(
                    f"{name}.{key} is not a setting of {name}; its settings are: "
                    f"{', '.join(sorted(allowed))}{hint}"
                )
    for group in CLOSED_GROUPS:
        node = cfg.get(group)
        if node is None or "_target_" in node or not isinstance(node.get("name"), str):
            continue  # the user's own target: every key is its argument
        option = builtin_dir() / group / f"{node.name}.yaml"
        if not option.is_file():
            continue
        allowed = set(_yaml(option)) - {"defaults"}
        settings = ", ".join(sorted(allowed - {"name", "plugin"}))
        for key in sorted(set(node) - allowed):
            match = did_you_mean(key, allowed - {"name", "plugin"})
            hint = f"; did you mean {group}.{match}?" if match else _other_options(group, key)
            found.append(
                f"{group}.{key} is not a setting of {group}={node.name}; its settings "
                f"are: {settings}{hint}"
            )
    return found + _unknown_feature_keys(cfg)


def unread_key_problems(cfg, keys: list[str]) -> list[str]:
    """Those problems of :func:`problems` that are about ``keys`` (a search space's: a
    key given in a sweep is a key of every job, without Hydra's ``+``)."""
    return [p for p in problems(cfg) if p.split(" ", 1)[0].split("=", 1)[0] in keys]


def _other_options(group: str, key: str) -> str:
    """``; it is a setting of model=mlp``: the built-in options of ``group`` that have ``key``."""
    from tuneup.trainer.config import builtin_dir

    others = sorted(p.stem for p in (builtin_dir() / group).glob("*.yaml") if key in _yaml(p))
    return f"; it is a setting of {' and '.join(f'{group}={o}' for o in others)}" if others else ""


#: Feature groups whose plugin names its own unknown keys in its check.
SELF_CHECKED = ("strategy", "checkpoint")


def _unknown_feature_keys(cfg) -> list[str]:
    """Keys under a built-in feature group's node that none of its options has
    (``+precision.init_scal=1024``): its plugin reads only those (optional ones included, as
    ``precision.skip`` of fp8), so this one would do nothing."""
    from tuneup.trainer.config import builtin_dir, searched_dirs

    builtin, found = builtin_dir(), []
    for group in sorted(p.name for p in builtin.iterdir() if p.is_dir()):
        node = cfg.get(group)
        if group in (*CLOSED_GROUPS, *SELF_CHECKED, "hydra") or not isinstance(node, DictConfig):
            continue
        allowed = _option_keys([builtin / group])
        if set(node) - allowed:  # options of the user's or a plugin's folders may add keys
            allowed = _option_keys([d / group for d in searched_dirs()])
        for key in sorted(set(node) - allowed):
            match = did_you_mean(key, allowed - {"name", "plugin"})
            hint = f"; did you mean {group}.{match}?" if match else ""
            settings = ", ".join(sorted(allowed - {"name", "plugin"})) or "none"
            found.append(
                f"{group}.{key} is not a setting of any {group} option; their settings "
                f"are: {settings}{hint}"
            )
    return found


def _option_keys(folders) -> set[str]:
    """Every top-level key the option files in ``folders`` give their node."""
    keys: set[str] = set()
    for folder in folders:
        for path in folder.glob("*.yaml") if folder.is_dir() else []:
            keys |= set(_yaml(path)) - {"defaults"}
    return keys


def _yaml(path) -> dict:
    """A config file's mapping (``{}`` if it holds none), for its keys: read with PyYAML's C
    loader (50x OmegaConf.load, which every run paid some 50 times here) and kept while the
    file is unchanged."""
    stat = path.stat()
    return _read_yaml(str(path), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=512)
def _read_yaml(path: str, _mtime_ns: int, _size: int) -> dict:
    import yaml

    with open(path) as f:
        loaded = yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    return loaded if isinstance(loaded, dict) else {}


def _unknown_top_level(cfg) -> list[str]:
    """Top-level keys no config file gives and nothing reads (``+precison=bf16``): not a key of
    conf/config.yaml, not a config group, not set by a preset, not a node switching a plugin
    on (``plugin: <name>``), and not used by an interpolation (``${my_width}``)."""
    from tuneup.trainer.config import builtin_dir, searched_dirs, top_level_keys

    builtin = builtin_dir()
    common = set(_yaml(builtin / "config.yaml")) | {p.name for p in builtin.iterdir()}
    unknown = [
        k
        for k in cfg
        if k not in common and not (isinstance(cfg.get(k), DictConfig) and "plugin" in cfg[k])
    ]
    if not unknown:
        return []  # the usual case, without reading every config file
    known = top_level_keys(searched_dirs())
    unknown = [k for k in unknown if k not in known]
    if unknown:
        text = OmegaConf.to_yaml(cfg, resolve=False)  # interpolations as written
        known |= {n for ref in re.findall(r"\$\{([^}]*)\}", text) for n in re.findall(r"\w+", ref)}
    found = []
    for key in unknown:
        if key in known:
            continue
        value = cfg.get(key)
        shown = key if isinstance(value, DictConfig) else f"{key}={value}"
        match = did_you_mean(key, known, prefer=_is_node(cfg) if shown == key else None)
        hint = f"; did you mean {_meant(match, value)}?" if match else ""
        found.append(
            f"{shown} is not allowed: {key} is not a config group or setting, nothing "
            f"would read it{hint}"
        )
    return found


def _is_node(cfg):
    """For ``+modle.hidden=32``: whether a top-level name is a node or a group (``model``),
    which a key with parts can be meant for, unlike a value (``mode``)."""
    from tuneup.trainer.config import builtin_dir

    return lambda name: isinstance(cfg.get(name), DictConfig) or (builtin_dir() / name).is_dir()


def _meant(name: str, value) -> str:
    """``name`` with ``value`` as an override: ``model.hidden=32`` for ``{hidden: 32}``."""
    if not isinstance(value, DictConfig):
        return f"{name}={value}"
    leaves = [(k, v) for k, v in value.items() if not isinstance(v, DictConfig)]
    if len(value) == 1 and len(leaves) == 1:
        return f"{name}.{leaves[0][0]}={leaves[0][1]}"
    return name
