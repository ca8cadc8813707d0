"""recipe.yaml: the answer as an experiment preset, for the full training run.

The recipe is the user's own command (without the autotune's settings) plus the winning
overrides, written as a Hydra experiment file (``# @package _global_``): group choices
become ``override /<group>: <option>`` entries of its defaults list, values become keys.
It lies in ``<sweep dir>/conf/experiment/recipe.yaml``, so either of::

    tuneup --config-dir <sweep dir>/conf experiment=recipe
    cp <sweep dir>/conf/experiment/recipe.yaml conf/experiment/fast.yaml && tuneup experiment=fast

trains with it (add the run's length, e.g. ``trainer.max_epochs=90``, as usual).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

#: Overrides that configure the search or the sweep, not the training run.
NOT_IN_RECIPE = ("experiment", "autotune", "hydra", "report")
RELATIVE_PATH = Path("conf") / "experiment" / "recipe.yaml"


#: The presets' group: ``experiment=[mine,autotune]`` autotunes the user's preset ``mine``.
PRESETS = "experiment"


def recipe_overrides(command: list[str], found: tuple[str, ...]) -> list[str]:
    """The user's own presets, the user's training overrides, then what the autotune found."""
    own = [o for o in command if _key(o).split(".")[0].split("/")[0] not in NOT_IN_RECIPE]
    return [*_own_presets(command), *own, *found]


def _own_presets(command: list[str]) -> list[str]:
    """``experiment=[mine]`` for ``experiment=[mine,autotune]``: the presets the recipe builds on."""
    for override in OverridesParser.create().parse_overrides(list(command)):
        if override.key_or_group == PRESETS and isinstance(override.value(), list):
            names = [n for n in override.value() if n != "autotune"]
            return [f"{PRESETS}=[{','.join(names)}]"] if names else []
    return []


def recipe_text(overrides: list[str], is_group: Callable[[str], bool], header: list[str]) -> str:
    """The experiment file for ``overrides`` (see the module docstring)."""
    defaults, values = [], OmegaConf.create({})
    for override in OverridesParser.create().parse_overrides(overrides):
        key = override.key_or_group
        if override.is_delete():
            continue
        if key == PRESETS:  # the user's presets first: the recipe's own values win over theirs
            defaults[:0] = [f"/{PRESETS}/{name}" for name in override.value()]
        elif is_group(key):
            prefix = "" if override.is_add() else "override "
            defaults.append({f"{prefix}/{key}": override.value()})
        else:
            OmegaConf.update(values, key, override.value(), force_add=True)
    body = {**({"defaults": defaults} if defaults else {}), **OmegaConf.to_container(values)}
    lines = ["# @package _global_", *(f"# {line}" for line in header)]
    return "\n".join(lines) + "\n" + (OmegaConf.to_yaml(body) if body else "{}\n")


def write_recipe(sweep_dir: Path, overrides: list[str], is_group, header: list[str]) -> Path:
    path = Path(sweep_dir) / RELATIVE_PATH
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(recipe_text(overrides, is_group, header))
    return path


def _key(override: str) -> str:
    return override.lstrip("+~").split("=")[0]
