"""The tests' compositions of the built-in configs: each set of config groups composed once.

A composition takes about 0.1 CPU-s, most of it Hydra building and merging the defaults tree
of the config groups; the suite composes some 500 in-process configs, most of them the tiny
overrides (values only) on one of a few sets of groups. Hydra composes in two steps: the group
overrides (``model=gpt``) make the defaults list, whose configs are merged, then the value
overrides (``data.batch_size=32``) are applied to the merged config in their order. The
study does the same for its trials (:class:`tuneup.autotune.composed.GroupComposer`, Hydra's
own parser and function), and so does :func:`compose`: a composition of each set of groups is
kept per set of what a composition reads besides the overrides (:func:`composition_inputs`;
the working directory only for its ./conf). Overrides the parser refuses, sweeps and
``hydra.*`` overrides (applied to Hydra's node, which ``tuneup.compose`` leaves out) are
composed whole. tests/test_compositions.py holds the configs and errors to Hydra's whole
compositions'.
"""

from __future__ import annotations

import copy
import os
import sys
from importlib.metadata import entry_points
from pathlib import Path

import tuneup
from tuneup.autotune.composed import GroupComposer
from tuneup.trainer import config as tuneup_config

#: (overrides, *composition inputs) -> the config: never handed out, only copies.
_COMPOSED: dict = {}
#: composition inputs but the working directory -> the composer keeping their compositions
#: of each set of groups (a working directory is read only for its ./conf, in the inputs).
_COMPOSERS: dict = {}


def compose(args: list[str]):
    """``tuneup.compose(args)`` for the built-in config folder, memoised per process; each
    call returns its own deep copy (50x cheaper than composing), so a test may change it."""
    inputs = composition_inputs()
    key = (tuple(args), *inputs)
    if key not in _COMPOSED:
        if inputs[1:] not in _COMPOSERS:
            _COMPOSERS[inputs[1:]] = Composer()
        _COMPOSED[key] = _COMPOSERS[inputs[1:]](list(args))
    tuneup_config._composed_dirs[:] = []  # as composing it does: no --config-dir folder
    return copy.deepcopy(_COMPOSED[key])


class Composer(GroupComposer):
    """The study's composer on ``tuneup.compose``: a kept composition per set of config
    groups, the values applied by Hydra; ``hydra.*`` overrides composed whole."""

    def __init__(self) -> None:
        super().__init__(tuneup.compose, [], self.group_exists)
        self.repository = None

    def group_exists(self, key: str) -> bool:
        if self.repository is None:
            self.repository = group_repository()
        return self.repository.group_exists(key)

    def split(self, overrides: list[str]):
        split = super().split(overrides)
        if split is None or any(o.is_hydra_override() for o in split[2]):
            return None
        return split


def group_repository():
    """Hydra's repository of config groups as ``tuneup.compose`` searches them here: the
    built-in configs, the project's ./conf and the installed plugins' (the primary config's
    ``hydra.searchpath``, added as Hydra's composition adds it)."""
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    with initialize_config_module(config_module="tuneup.conf", version_base="1.3"):
        tuneup_config.register()
        loader = GlobalHydra.instance().config_loader()
        return loader._parse_overrides_and_create_caching_repo("config", [])[1]


def composition_inputs() -> tuple:
    """What a composition reads besides its overrides and the built-in folder (which no test
    changes): the working directory, its ./conf files, the installed plugins' entry points and
    the ConfigStore's nodes but tuneup's own (stored anew by each composition, from the
    plugins)."""
    from hydra.core.config_store import ConfigStore

    cwd = Path.cwd()
    own = tuneup_config.user_dir(cwd)
    files = (
        ()
        if own is None
        else tuple(
            (str(f), f.stat().st_mtime_ns, f.stat().st_size)
            for f in sorted(own.rglob("*"))
            if f.is_file()
        )
    )
    plugins = installed_plugins()
    repo = {k: v for k, v in ConfigStore.instance().repo.items() if k != "_tuneup"}
    return str(cwd), files, plugins, tuple(sorted(_stored_nodes(repo)))


def installed_plugins() -> tuple[str, ...]:
    """``name=value`` of each entry point of group ``tuneup``, sorted. Reading every installed
    distribution's metadata takes 3 ms, at every call of :func:`compose`; kept while no folder
    on ``sys.path`` changed (a distribution installed into one changes its time)."""
    key = tuple((p, _changed(p)) for p in sys.path)
    if key not in _PLUGINS:
        found = entry_points(group="tuneup")
        _PLUGINS[key] = tuple(sorted(f"{ep.name}={ep.value}" for ep in found))
    return _PLUGINS[key]


#: (each folder of sys.path, its time) -> installed_plugins()
_PLUGINS: dict = {}


def _changed(folder: str) -> int | None:
    try:
        return os.stat(folder or ".").st_mtime_ns
    except OSError:
        return None


def _stored_nodes(group: dict, path: str = ""):
    """(path, id) of every node in a ConfigStore group, its sub-groups' too: a node stored
    again is a new object."""
    for name, entry in group.items():
        if isinstance(entry, dict):
            yield from _stored_nodes(entry, f"{path}{name}/")
        else:
            yield f"{path}{name}", id(entry)
