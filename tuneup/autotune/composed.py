"""The study's compositions of its trials, on a composition kept per set of config groups.

The study checks every trial's overrides before launching it (space.Checks), and every trial
has values of its own (``optimizer.lr=0.0123``): composed from scratch, each check reads and
merges the whole defaults tree again, the larger part of the sweeper's own work per trial.
Hydra composes in two steps (``ConfigLoaderImpl._load_configuration_impl``): the config group
overrides (``optimizer=nadamw``) make the defaults list, whose configs are merged; then the
value overrides are applied to the merged config, in their order, by
``ConfigLoaderImpl._apply_overrides_to_config``. :class:`GroupComposer` keeps the first step's
result per set of group overrides (the command's values applied, as Hydra applies them before
the trial's, which come after them) and applies a trial's config overrides to a copy, told
apart from its group overrides as Hydra tells them, with Hydra's own parser and function.
Where the parser refuses an override, or one is a sweep, the whole composition runs (and
says why). The trial's job composes as Hydra does.
"""

from __future__ import annotations

import copy
from collections.abc import Callable


class GroupComposer:
    """Called with a trial's overrides: the config ``load([*base, *overrides])`` makes (the
    sweeper's composition of a job's config), the compositions of each set of group overrides
    kept; ``is_group(key)``: whether Hydra's repository has config group ``key``."""

    def __init__(
        self, load: Callable[[list[str]], object], base: list[str], is_group: Callable
    ) -> None:
        self.load, self.base, self.is_group = load, list(base), is_group
        self.composed: dict[tuple[str, ...], object] = {}

    def __call__(self, overrides: list[str]):
        from hydra._internal.config_loader_impl import ConfigLoaderImpl
        from omegaconf import OmegaConf

        split = self.split(overrides)
        if split is None or not split[1]:
            return self.load([*self.base, *overrides])
        groups, values, parsed = split
        key = tuple(g.input_line for g in groups)
        if key not in self.composed:
            self.composed[key] = self.load([*self.base, *key])
        kept = self.composed[key]
        cfg = copy.deepcopy(kept)
        ConfigLoaderImpl._apply_overrides_to_config(values, cfg)
        _record(cfg, parsed, groups)
        OmegaConf.copy_cache(from_config=kept, to_config=cfg)
        return cfg

    def split(self, overrides: list[str]):
        """(the config group overrides, the config overrides, all of them; parsed), as
        Hydra's defaults list tells them apart (``hydra._internal.defaults_list.Overrides``);
        None where the parser refuses one or one is a sweep (Hydra's composition says why)."""
        from hydra.core.override_parser.overrides_parser import OverridesParser

        try:
            parsed = OverridesParser.create().parse_overrides(list(overrides))
        except Exception:
            return None
        groups, values = [], []
        for override in parsed:
            if override.is_sweep_override():
                return None
            if isinstance(override.value(), dict) or not self.is_group(override.key_or_group):
                values.append(override)
            else:
                groups.append(override)
        return groups, values, parsed


def _record(cfg, parsed, groups) -> None:
    """What Hydra's composition records of a trial's overrides (``parsed``, in their order) in
    ``cfg.hydra``, where the composition kept recorded its ``groups`` last: the lists of
    overrides, and the job's ``override_dirname`` made of the task's."""
    from hydra._internal.config_loader_impl import get_overrides_dirname
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import open_dict

    if "hydra" not in cfg:  # a composition without Hydra's node (tuneup.compose's) records none
        return
    hydra = cfg.hydra
    with open_dict(hydra):
        for kind, of_hydra in (("hydra", True), ("task", False)):
            recorded = list(hydra.overrides[kind])
            kept = sum(1 for o in groups if o.is_hydra_override() == of_hydra)
            mine = [o.input_line for o in parsed if o.is_hydra_override() == of_hydra]
            hydra.overrides[kind] = recorded[: len(recorded) - kept] + mine
        dirname = hydra.job.config.override_dirname
        hydra.job.override_dirname = get_overrides_dirname(
            overrides=OverridesParser.create().parse_overrides(list(hydra.overrides.task)),
            kv_sep=dirname.kv_sep,
            item_sep=dirname.item_sep,
            exclude_keys=dirname.exclude_keys,
        )
