"""Which plugins a run has, how they are called, and how their failures are named.

Built-in plugins live in the ``plugins`` package, one module (or package) each.
A config node that holds ``plugin: <name>`` switches the built-in ``<name>`` on,
so a feature is one YAML group plus one module: ``precision=fp16`` selects
``conf/precision/fp16.yaml`` whose ``plugin: precision`` loads
``plugins/precision.py``. The module defines ``class Plugin`` whose instance is
registered (constructed with the run's config when ``__init__`` takes one).

Installed distributions add plugins through the entry-point group ``tuneup``
(like pytest's ``pytest11``). ``plugins.disable=[name,...]`` blocks any plugin
by name; ``plugins.autoload=false`` (or ``TUNEUP_DISABLE_PLUGIN_AUTOLOAD=1``)
skips entry points altogether.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import os
import pkgutil
from collections.abc import Iterator

import pluggy
from omegaconf import DictConfig, OmegaConf

from trainer import PROJECT, TuneupError, hookspecs

#: Built-in plugins that every run has; they cannot be disabled.
REQUIRED = ("measure",)


class PluginError(TuneupError):
    """A plugin could not be found, loaded, or it raised in a hook. Always names the plugin."""


def builtin_names() -> list[str]:
    """Names of the modules in the ``plugins`` package."""
    import plugins

    return sorted(
        m.name for m in pkgutil.iter_modules(plugins.__path__) if not m.name.startswith("_")
    )


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


class PluginManager(pluggy.PluginManager):
    """pluggy's manager plus tuneup's loading rules, pipelines and error naming."""

    def __init__(self) -> None:
        super().__init__(PROJECT)
        self.add_hookspecs(hookspecs)
        self.sources: dict[str, str] = {}  # plugin name -> where it came from
        self.config_keys: dict[str, str] = {}  # built-in plugin name -> its config node

    # -- loading ------------------------------------------------------------------------

    @classmethod
    def from_config(cls, cfg) -> PluginManager:
        """Register the built-ins the config switches on and, unless disabled, entry points."""
        pm = cls()
        settings = cfg.get("plugins") or {}
        disabled = list(settings.get("disable") or [])
        for name in disabled:
            if name in REQUIRED:
                raise PluginError(f"plugin '{name}' is required and cannot be disabled")
            pm.set_blocked(name)
        wanted = switched_on(cfg)
        for name in REQUIRED:
            wanted.setdefault(name, name)
        known = builtin_names()
        for name, key in wanted.items():
            if name not in known:
                raise PluginError(
                    f"unknown plugin '{name}' (named by config key '{key}.plugin'); "
                    f"built-in plugins are: {', '.join(known)}"
                )
            if not pm.is_blocked(name):
                pm.register_builtin(name, cfg)
                pm.config_keys[name] = key
        autoload = settings.get("autoload", True) and not os.environ.get(
            "TUNEUP_DISABLE_PLUGIN_AUTOLOAD"
        )
        if autoload:
            pm.load_entry_points()
        try:
            pm.check_pending()
        except pluggy.PluginValidationError as exc:
            name = pm.get_name(exc.plugin)
            raise PluginError(f"plugin '{name}' is invalid: {exc}") from exc
        return pm

    def register_builtin(self, name: str, cfg) -> None:
        try:
            module = importlib.import_module(f"plugins.{name}")
        except Exception as exc:
            raise PluginError(
                f"plugin '{name}' failed to import: {type(exc).__name__}: {exc}"
            ) from exc
        if not hasattr(module, "Plugin"):
            raise PluginError(f"plugin '{name}': module plugins.{name} defines no class Plugin")
        self._register(_instantiate(module.Plugin, cfg, name), name, f"built-in plugins.{name}")

    def load_entry_points(self) -> None:
        """Load every entry point of group ``tuneup`` that is not blocked.

        pluggy's ``load_setuptools_entrypoints`` would do, but its errors do not
        say which plugin failed to import; ours do.
        """
        for ep in importlib.metadata.entry_points(group=PROJECT):
            if self.is_blocked(ep.name) or self.has_plugin(ep.name):
                continue
            dist = f"{ep.dist.name} {ep.dist.version}" if ep.dist else "unknown distribution"
            try:
                obj = ep.load()
            except Exception as exc:
                raise PluginError(
                    f"plugin '{ep.name}' (entry point '{ep.value}' of {dist}) failed to import: "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
            if inspect.isclass(obj):
                obj = _instantiate(obj, None, ep.name)
            self._register(obj, ep.name, f"entry point {ep.value} ({dist})")

    def _register(self, obj, name: str, source: str) -> None:
        try:
            self.register(obj, name=name)
        except pluggy.PluginValidationError as exc:
            raise PluginError(f"plugin '{name}' is invalid: {exc}") from exc
        self.sources[name] = source

    # -- calling ------------------------------------------------------------------------

    def call(self, hook_name: str, **kwargs):
        """Call a hook through pluggy; an exception from a plugin is re-raised naming it."""
        hook = getattr(self.hook, hook_name)
        try:
            return hook(**kwargs)
        except Exception as exc:
            raise self._named(hook_name, exc) from exc

    def pipeline(self, hook_name: str, value_name: str, value, **kwargs):
        """Run a pipeline hook: each implementation gets the previous one's result.

        Order is pluggy's call order (``tryfirst`` first, ``trylast`` last);
        an implementation returning None keeps the value it was given.
        """
        for impl in self.call_order(hook_name):
            args = {**kwargs, value_name: value}
            try:
                result = impl.function(*(args[a] for a in impl.argnames))
            except Exception as exc:
                raise self._error(impl.plugin_name, hook_name, exc) from exc
            if result is not None:
                value = result
        return value

    def call_order(self, hook_name: str) -> list:
        """Hook implementations in the order pluggy calls them (first called first)."""
        return list(reversed(getattr(self.hook, hook_name).get_hookimpls()))

    def check(self, cfg, env) -> list[str]:
        """All plugins' problems, each prefixed with the plugin that found it."""
        found = []
        for impl in self.call_order("check"):
            args = {"cfg": cfg, "env": env}
            try:
                result = impl.function(*(args[a] for a in impl.argnames))
            except Exception as exc:
                raise self._error(impl.plugin_name, "check", exc) from exc
            found += [f"[{impl.plugin_name}] {p}" for p in result or []]
        return found

    def _named(self, hook_name: str, exc: Exception) -> Exception:
        culprit = _culprit(exc, self.call_order(hook_name))
        if culprit is None:
            return (
                exc
                if isinstance(exc, TuneupError)
                else PluginError(
                    f"hook '{hook_name}' failed outside any plugin: {type(exc).__name__}: {exc}"
                )
            )
        return self._error(culprit, hook_name, exc)

    @staticmethod
    def _error(name: str, hook_name: str, exc: Exception) -> PluginError:
        if isinstance(exc, PluginError):
            return exc
        return PluginError(
            f"plugin '{name}' failed in hook '{hook_name}': {type(exc).__name__}: {exc}"
        )

    # -- per-plugin protocol: describe / state_dict / load_state_dict ---------------------

    def named_plugins(self) -> Iterator[tuple[str, object]]:
        for name, plugin in self.list_name_plugin():
            if plugin is not None:
                yield name, plugin

    def describe(self, cfg) -> dict[str, dict]:
        """Each active plugin's effective settings, for the summary and the listing."""
        described = {}
        for name, plugin in sorted(self.named_plugins()):
            if hasattr(plugin, "describe"):
                settings = dict(plugin.describe())
            elif name in self.config_keys:
                node = OmegaConf.to_container(cfg[self.config_keys[name]], resolve=True)
                settings = {k: v for k, v in node.items() if k != "plugin"}
            else:
                settings = {}
            described[name] = settings
        return described

    def state_dicts(self) -> dict[str, dict]:
        return {n: p.state_dict() for n, p in self.named_plugins() if hasattr(p, "state_dict")}

    def load_state_dicts(self, states: dict[str, dict]) -> None:
        for name, plugin in self.named_plugins():
            if name in states and hasattr(plugin, "load_state_dict"):
                plugin.load_state_dict(states[name])

    def listing(self, cfg) -> str:
        """Human-readable: active plugins, where they come from, their hooks in call order."""
        lines = ["Active plugins:"]
        settings = self.describe(cfg)
        for name in sorted(self.sources):
            lines.append(f"  {name:<24} {self.sources[name]}")
            if settings.get(name):
                lines.append(f"  {'':<24} settings: {settings[name]}")
        lines.append("")
        lines.append("Hooks (implementations in call order, first runs first):")
        for hook_name in _spec_order():
            impls = self.call_order(hook_name)
            if impls:
                lines.append(f"  {hook_name:<26} " + " -> ".join(_label(i) for i in impls))
        return "\n".join(lines)


def _instantiate(cls, cfg, name: str):
    try:
        takes_cfg = len(inspect.signature(cls).parameters) > 0
        return cls(cfg) if takes_cfg else cls()
    except TuneupError:
        raise
    except Exception as exc:
        raise PluginError(f"plugin '{name}' failed to start: {type(exc).__name__}: {exc}") from exc


def _culprit(exc: BaseException, impls: list) -> str | None:
    """The plugin whose hook function is deepest in the traceback of ``exc``."""
    codes = {getattr(i.function, "__code__", None): i.plugin_name for i in impls}
    name, tb = None, exc.__traceback__
    while tb is not None:
        name = codes.get(tb.tb_frame.f_code, name)
        tb = tb.tb_next
    return name


def _label(impl) -> str:
    flags = [f for f in ("tryfirst", "trylast") if getattr(impl, f)]
    return impl.plugin_name + (f" ({', '.join(flags)})" if flags else "")


def _spec_order() -> list[str]:
    return [n for n, f in vars(hookspecs).items() if callable(f) and hasattr(f, "tuneup_spec")]
