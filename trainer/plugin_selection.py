"""Which plugins a run has: the entry points of group ``tuneup`` that its config switches on,
the required ones, and the always-on installed ones.

Every plugin, built-in or installed, is an entry point of group ``tuneup``; the
built-ins are the entry points of the ``tuneup`` distribution itself
(``tuneup.plugins.<name>:Plugin``, listed in pyproject.toml), so the core never
imports ``tuneup.plugins``. Which ones a run registers:

- A config node that holds ``plugin: <name>`` switches plugin ``<name>`` on, built-in
  or installed: ``precision=fp16`` selects ``conf/precision/fp16.yaml`` whose
  ``plugin: precision`` loads ``plugins/precision/``; ``gradclip=on`` selects an
  installed package's ``conf/gradclip/on.yaml`` whose ``plugin: gradclip`` loads that
  package's entry point ``gradclip``. Such a plugin is off until a config names it.
- An installed plugin whose package ships no ``conf/`` has nothing to switch it, so it
  is on whenever it is installed (like pytest plugins).

``plugins.disable=[name,...]`` blocks any plugin by name; ``plugins.autoload=false``
(or ``TUNEUP_DISABLE_PLUGIN_AUTOLOAD=1``) skips the always-on installed plugins.
"""

from __future__ import annotations

import importlib.metadata
import os

import pluggy
from omegaconf import DictConfig

from tuneup.errors import TuneupError
from tuneup.trainer import hookspecs
from tuneup.trainer.config import is_builtin, plugin_dir

#: Built-in plugins that every run has; they cannot be disabled.
REQUIRED = ("measure",)


class PluginError(TuneupError):
    """A plugin could not be found, loaded, or it raised in a hook. Always names the plugin."""


def entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    """Every plugin entry point by name; a name claimed by two distributions is an error."""
    found: dict[str, importlib.metadata.EntryPoint] = {}
    for ep in importlib.metadata.entry_points(group=hookspecs.PROJECT):
        if ep.name in found and found[ep.name].value != ep.value:
            raise PluginError(
                f"plugin name '{ep.name}' is claimed by {origin(found[ep.name])} and by "
                f"{origin(ep)}; uninstall one of them"
            )
        found[ep.name] = ep
    return found


def switched_by_config(ep: importlib.metadata.EntryPoint) -> bool:
    """Whether config switches this plugin on: a built-in, or a package that ships ``conf/``."""
    return is_builtin(ep) or plugin_dir(ep) is not None


def origin(ep: importlib.metadata.EntryPoint) -> str:
    dist = f"{ep.dist.name} {ep.dist.version}" if ep.dist else "an unknown distribution"
    return f"entry point '{ep.value}' of {dist}"


def switched_on(cfg) -> dict[str, str]:
    """Built-in plugins the config switches on: plugin name -> the config key that names it."""
    found = {}
    for key in cfg:
        node = cfg.get(key)
        if isinstance(node, DictConfig) and "plugin" in node:
            name = node.plugin
            if name in found:
                raise PluginError(f"plugin '{name}' is named by both '{found[name]}' and '{key}'")
            found[name] = key
    return found


def register_plugins(pm, cfg) -> None:
    """Register on ``pm`` (a :class:`~tuneup.trainer.plugin_manager.PluginManager`) the
    plugins the config switches on and, unless disabled, the always-on ones."""
    settings = cfg.get("plugins") or {}
    available = entry_points()
    for name in settings.get("disable") or []:
        if name in REQUIRED:
            raise PluginError(f"plugin '{name}' is required and cannot be disabled")
        if name not in available:  # a typo would leave the plugin on, silently
            raise PluginError(_not_installed(name, settings.disable, available))
        pm.set_blocked(name)
    wanted = switched_on(cfg)
    for name in REQUIRED:
        wanted.setdefault(name, name)
    for name, key in wanted.items():
        if pm.is_blocked(name):
            pm.left_out[name] = key  # a contradiction: check() says so
        else:
            pm.register_named(name, cfg, key, available)
    autoload = settings.get("autoload", True) and not os.environ.get(
        "TUNEUP_DISABLE_PLUGIN_AUTOLOAD"
    )
    if autoload:
        for ep in available.values():
            if not (pm.is_blocked(ep.name) or pm.has_plugin(ep.name) or switched_by_config(ep)):
                pm.register_entry_point(ep, cfg)
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        name = pm.get_name(exc.plugin)
        raise PluginError(f"plugin '{name}' is invalid: {exc}") from exc


def _not_installed(name: str, disabled, available) -> str:
    """The one line for a name in ``plugins.disable`` that no installed plugin has."""
    listed = ",".join(str(n) for n in disabled)
    return (
        f"plugins.disable=[{listed}] names '{name}', which is not an installed plugin; allowed: "
        f"{', '.join(sorted(set(available) - set(REQUIRED)))}"
    )
