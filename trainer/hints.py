"""What the user most likely meant: the one line that replaces Hydra's refusal of a typo.

``tuneup modle.hidden=32``, ``precison=bf16``, ``weight_decay=skip_norm``: Hydra refuses them
with its own lines ("Could not override", "Could not find" and a search-path dump); the
command (tuneup/cli.py) prints one ``error:`` line from here instead, naming the key or option
most likely meant (found by typos.py, with which the run's checks, trainer/unread_keys.py,
name what was meant for the keys Hydra lets through with a ``+``).

Nothing here imports torch; only a command Hydra refused pays for a second composition.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from tuneup.trainer import config, config_folders, off_options
from tuneup.trainer.typos import did_you_mean, has, options_with, suggest_key, suggest_root


def _parsed(argv: list[str]):
    """(Hydra's parsed command line, its overrides), or None where Hydra cannot parse it."""
    from hydra._internal.utils import get_args_parser
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        args = get_args_parser().parse_args(argv)
        return args, OverridesParser.create().parse_overrides(args.overrides)
    except Exception:
        return None


def override_hints(argv: list[str]) -> list[str]:
    """For overrides Hydra refused, the key most likely meant: unknown keys (``precison=bf16``,
    ``modle.hidden=32``: "Could not override") and a ``+`` before a key that exists
    (``+ema.decay=0.9``: "Could not append"). Composes the config again, so only called after
    a failure."""
    from hydra.core.override_parser.types import OverrideType

    parsed = _parsed(argv)
    if parsed is None:
        return []
    args, overrides = parsed
    ours = [
        o
        for o in overrides
        if o.package is None and not o.key_or_group.startswith(f"{config.HYDRA_GROUP}.")
    ]
    chosen = [
        o.input_line
        for o in ours
        if o.type == OverrideType.CHANGE and "." not in o.key_or_group and not o.is_sweep_override()
    ]
    cfg = None
    for attempt in (chosen, []):  # the groups as chosen, else the defaults
        try:
            cfg = config.compose(attempt, config_dir=args.config_dir)
            break
        except Exception:
            continue
    if cfg is None:
        return []
    folders = [folder for _, folder in config_folders.config_dirs(_config_dir_argv(args))]
    hints = []
    for o in ours:
        key, value = o.key_or_group, o.input_line.split("=", 1)[-1]
        exists = has(cfg, key)
        if o.type == OverrideType.ADD and exists:
            hints.append(_plus_hint(cfg, key, value))
        elif o.type == OverrideType.CHANGE and not exists:
            hint = _unknown_key_hint(cfg, key, value, folders)
            if hint is not None:
                hints.append(hint)
    return hints


def _config_dir_argv(args) -> list[str]:
    return ["--config-dir", args.config_dir] if args.config_dir else []


def _unknown_key_hint(cfg, key: str, value: str, folders: list[Path]) -> str | None:
    """One line for a key the composed ``cfg`` lacks: the key meant, or the settings there are."""
    root, _, rest = key.partition(".")
    if rest and root not in cfg:  # a typo of a group or a top-level node (modle.hidden)
        match = suggest_root(cfg, key, folders)
        if root in _known_groups(folders) and match in (None, key):  # experiment.x: presets
            return (
                f"{key}={value}: {root} is a config group of presets, which set keys of other "
                f"groups, and has no settings of its own; choose one: {root}=<option> "
                "(tuneup --help lists them)"
            )
        if match is None:  # myplugin.every=2 before the package is installed
            return _unknown_group(key, value)
        return (
            f"did you mean {_with_option(cfg, match, value, folders)}? ({root} is not a "
            "config group or setting)"
        )
    match = suggest_key(cfg, key)
    if match is None and key.startswith("trainer."):  # Lightning's others, with a +
        match = suggest_key(cfg, key, {"trainer": trainer_arguments()})
    if match is not None:
        plus = "" if has(cfg, match) else "+"
        return (
            f"did you mean {plus}{match}={value}? ({key} is not a setting; +{key}={value} "
            "would be refused: nothing reads it)"
        )
    if not rest:  # no group, setting or installed plugin's group near it: Hydra's 7 lines
        return None if key in _known_groups(folders) else _unknown_group(key, value)
    node = OmegaConf.select(cfg, root, default=None)
    if "." in rest or not isinstance(node, DictConfig):
        return None
    chosen = f"{root}={node.name}" if isinstance(node.get("name"), str) else root
    settings = ", ".join(sorted(set(node) - {"name", "plugin"})) or "none"
    match = did_you_mean(rest, _group_keys(root, folders))  # another option's (model.hidden)
    others = options_with(root, match, folders) if match is not None else []
    if match == rest and len(others) > 1:  # as typed, but a setting of other options
        return (
            f"{key} is not a setting of {chosen} (its settings are: {settings}); it is one "
            f"of {', '.join(f'{root}={o}' for o in others)}"
        )
    if match is not None:
        meant = _with_option(cfg, f"{root}.{match}", value, folders)
        return f"did you mean {meant}? ({chosen} has no {rest})"
    return f"{key} is not a setting of {chosen}; its settings are: {settings}"


def _known_groups(folders: list[Path]) -> set[str]:
    """The top-level config groups in ``folders`` (``experiment`` too, whose options are
    ``_global_`` and leave no node of that name)."""
    return {g.split("/")[0] for folder in folders for g in config.groups(folder)}


def _unknown_group(key: str, value: str) -> str:
    """A top-level ``key=value`` close to nothing: most often the group of a plugin package
    that is not installed (``myplugin=on``), which only its installation adds."""
    from importlib.metadata import entry_points

    root = key.split(".")[0]
    if root in {ep.name for ep in entry_points(group=config.PROJECT)}:  # installed, no conf/
        return (
            f"{key}={value}: plugin '{root}' is installed but has no config group to switch it: "
            f"it is on in every run (plugins.disable=[{root}] leaves it out)"
        )
    return (
        f"{key}={value}: {root} is not a config group or setting, nor the group of an installed "
        "plugin package (install the package first); tuneup --help lists the groups and their "
        "options, tuneup plugins.list=true the installed plugins"
    )


def _group_keys(group: str, folders: list[Path]) -> set[str]:
    """Every key an option of ``group`` gives its node."""
    keys: set[str] = set()
    for folder in folders:
        for path in (Path(folder) / group).glob("*.yaml"):
            node = OmegaConf.load(path)
            node = node.get(group) if config._is_global(path) else node
            keys |= set(node) - {"defaults", "name", "plugin"} if OmegaConf.is_dict(node) else set()
    return keys


def _with_option(cfg, key: str, value: str, folders: list[Path]) -> str:
    """``key=value``, with the option of its group that has ``key`` where the chosen one does
    not: ``model=mlp model.hidden=32``."""
    meant = f"{key}={value}"
    if has(cfg, key) or "." not in key:
        return meant
    group, _, rest = key.partition(".")
    others = options_with(group, rest, folders)
    if len(others) == 1:
        return f"{group}={others[0]} {meant}"
    return meant + (f" (with {' or '.join(f'{group}={o}' for o in others)})" if others else "")


def _plus_hint(cfg, key: str, value: str) -> str:
    """For ``+ema.decay=0.9`` where ``ema.decay`` exists: without the ``+``; and where the
    plugin is off, that nothing would read it (trainer/checks.py refuses it there)."""
    text = f"{key} is a setting already: give it without the +, {key}={value}"
    group = key.split(".")[0]
    if off_options.plugin_is_off(cfg, group):
        text += (
            f"; but with {group}=off nothing reads it: switch the plugin on with "
            f"{' or '.join(f'{group}={o}' for o in off_options.options_switching_on(group))}"
        )
    return text


def repeated_presets(argv: list[str]) -> list[str]:
    """``experiment=mine experiment=autotune``: Hydra would keep the last preset alone and
    drop ``mine`` without a word; one line saying how presets combine (a list), or nothing."""
    from hydra.core.override_parser.types import OverrideType

    parsed = _parsed(argv)
    given = [
        o
        for o in (parsed[1] if parsed else [])
        if o.key_or_group == PRESETS and o.type == OverrideType.CHANGE and o.package is None
    ]
    if len(given) < 2:
        return []
    text = (
        f"{PRESETS} is given {len(given)} times ({' '.join(o.input_line for o in given)}): "
        "Hydra would use the last one alone; presets combine as one list"
    )
    if any(o.is_sweep_override() for o in given):
        return [text + f", {PRESETS}=[a,b] (a sweep of lists: {PRESETS}=[a,b],[a,c])"]
    names = [n for o in given for n in (o.value() if isinstance(o.value(), list) else [o.value()])]
    return [text + f", {PRESETS}=[{','.join(map(str, names))}] (a later one's values win)"]


#: The group of presets (``# @package _global_`` files that set several groups and keys).
PRESETS = "experiment"


def choice_hints(argv: list[str]) -> list[str]:
    """For a group override whose option does not exist (``precision=fp61``, ``model=resnet``):
    one line naming the group's options and the one most likely meant. Reads the config
    folders only (nothing composed), so Hydra's 12-line "Could not find" can be replaced."""
    from hydra.core.override_parser.types import OverrideType

    parsed = _parsed(argv)
    if parsed is None:
        return []
    args, overrides = parsed
    options: dict[str, set[str]] = {}
    for _, folder in config_folders.config_dirs(_config_dir_argv(args)):
        for group, names in config.groups(folder).items():
            options.setdefault(group, set()).update(names)
    hints = []
    for o in overrides:
        group = o.key_or_group
        if o.type != OverrideType.CHANGE or o.package is not None or group not in options:
            continue
        values = list(o.sweep_string_iterator()) if o.is_sweep_override() else [o.value()]
        for value in values:
            if not isinstance(value, str) or value in options[group]:
                continue
            known = sorted(options[group])
            match = did_you_mean(value, known)
            meant = f"; did you mean {group}={match}?" if match else ""
            hints.append(
                f"{group}={value} is not an option of {group}; its options are: "
                f"{', '.join(known)}{meant}"
            )
    return hints


def trainer_arguments() -> set[str]:
    """The Lightning Trainer's argument names (imports Lightning: seconds, so only on demand)."""
    import inspect

    import pytorch_lightning as pl

    return set(inspect.signature(pl.Trainer.__init__).parameters) - {"self"}
