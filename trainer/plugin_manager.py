"""How a run's plugins are loaded, how they are called, and how their failures are named.

Which plugins a run has is plugin_selection.py's; :meth:`PluginManager.from_config` registers
them here. The plugin object is the entry point's class, constructed with the run's config
when ``__init__`` takes an argument (or the module or object the entry point names). Every
error names the plugin, in one line.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import logging
from collections.abc import Iterator

import pluggy
from omegaconf import DictConfig, OmegaConf

from tuneup.errors import TuneupError
from tuneup.trainer import console, hookspecs
from tuneup.trainer.config import is_builtin
from tuneup.trainer.plugin_selection import PluginError, entry_points, origin, register_plugins

log = logging.getLogger(__name__)


class PluginManager(pluggy.PluginManager):
    """pluggy's manager plus tuneup's loading, pipelines and error naming."""

    def __init__(self) -> None:
        super().__init__(hookspecs.PROJECT)
        self.add_hookspecs(hookspecs)
        self.sources: dict[str, str] = {}  # plugin name -> where it came from
        self.config_keys: dict[str, str] = {}  # plugin named by config -> its config node
        self.left_out: dict[str, str] = {}  # plugin named by config but disabled -> its node

    # -- loading ------------------------------------------------------------------------

    @classmethod
    def from_config(cls, cfg) -> PluginManager:
        """Register the plugins the config switches on and, unless disabled, the always-on ones."""
        pm = cls()
        register_plugins(pm, cfg)
        return pm

    def register_named(self, name: str, cfg, key: str | None = None, available=None) -> None:
        """Register the plugin called ``name`` (named by config node ``key``)."""
        available = entry_points() if available is None else available
        if name not in available:
            raise PluginError(
                f"unknown plugin '{name}' (named by config key '{key or name}.plugin'); "
                f"the plugins installed are: {', '.join(sorted(available))}"
            )
        self.register_entry_point(available[name], cfg)
        self.config_keys[name] = key or name

    def register_entry_point(self, ep: importlib.metadata.EntryPoint, cfg) -> None:
        """Load ``ep`` and register its plugin (a class is constructed, with ``cfg`` if it takes
        an argument). Import errors name the plugin and where it comes from; pluggy's own
        ``load_setuptools_entrypoints`` would not say which plugin failed."""
        source = f"built-in {ep.module}" if is_builtin(ep) else origin(ep)
        try:
            with console.file_only(f"importing plugin '{ep.name}' ({source})"):  # its noise
                obj = ep.load()
        except Exception as exc:
            raise PluginError(
                f"plugin '{ep.name}' ({source}) failed to import: {_one_line(exc)}"
            ) from exc
        if inspect.isclass(obj):
            obj = _instantiate(obj, cfg, ep.name)
        self._register(obj, ep.name, source)

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

    def call_each(self, hook_name: str, **kwargs) -> dict[str, str]:
        """Call every implementation of ``hook_name`` by itself, in pluggy's call order: one
        that raises is recorded (plugin name -> its error, logged naming the plugin) and the
        others still run. pluggy's own call stops at the first exception, which skipped every
        implementation after it (``report``: one plugin's failure blanked the others'
        figures). Wrappers (``wrapper=True`` or ``hookwrapper=True``) wrap the others as in
        pluggy: their code before ``yield`` runs first, the rest after."""
        failed: dict[str, str] = {}

        def attempt(impl, call):
            try:
                return call()
            except StopIteration:  # a wrapper that returned after its yield
                return None
            except Exception as exc:
                error = self._error(impl.plugin_name, hook_name, exc)
                log.error("%s", error)  # one line on the console; the traceback in the file:
                log.error(
                    "%s: traceback",
                    error,
                    exc_info=(type(exc), exc, exc.__traceback__),
                    extra={"file_only": True},
                )
                failed.setdefault(impl.plugin_name, f"{type(exc).__name__}: {exc}")
                return None

        impls = self.call_order(hook_name)
        opened = []  # wrappers that reached their yield, outermost first
        for impl in (i for i in impls if i.wrapper or i.hookwrapper):
            generator = attempt(impl, lambda i=impl: i.function(*(kwargs[a] for a in i.argnames)))
            if generator is not None and attempt(impl, lambda g=generator: (next(g), g)[1]):
                opened.append((impl, generator))
        for impl in (i for i in impls if not (i.wrapper or i.hookwrapper)):
            attempt(impl, lambda i=impl: i.function(*(kwargs[a] for a in i.argnames)))
        for impl, generator in reversed(opened):
            sent = pluggy.Result(None, None) if impl.hookwrapper else None
            attempt(impl, lambda g=generator, v=sent: g.send(v))
        return failed

    def call_order(self, hook_name: str) -> list:
        """Hook implementations in the order pluggy calls them (first called first)."""
        return list(reversed(getattr(self.hook, hook_name).get_hookimpls()))

    def check(self, cfg, env, plan=None) -> list[str]:
        """All plugins' problems, each prefixed with the plugin that found it."""
        if plan is None:
            from tuneup.trainer.components import Plan

            plan = Plan(cfg)
        disabled = ",".join((cfg.get("plugins") or {}).get("disable") or [])
        found = [
            f"{_setting(cfg, key)} switches plugin '{name}' on, but plugins.disable=[{disabled}] "
            f"leaves it out: the run would ignore {_setting(cfg, key)}; remove one of the two"
            for name, key in self.left_out.items()
        ]
        for impl in self.call_order("check"):
            args = {"cfg": cfg, "env": env, "plan": plan}
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
        if isinstance(exc, TuneupError):  # a refusal the plugin wrote for the user: as check's
            return PluginError(f"[{name}] {exc}")
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
                try:
                    settings = dict(plugin.describe())
                except Exception as exc:  # a summary is written also after a failure
                    settings = {"describe_error": f"{type(exc).__name__}: {exc}"}
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


def _setting(cfg, key: str) -> str:
    """How the user chose config node ``key``: ``precision=fp16``, from Hydra's choices or the
    node's ``name``; the node itself where neither says (an in-process compose of ``ema=on``)."""
    choice = None
    try:
        from hydra.core.hydra_config import HydraConfig

        if HydraConfig.initialized():
            choice = HydraConfig.get().runtime.choices.get(key)
    except ImportError:
        pass
    if choice is None:
        node = cfg.get(key)
        choice = node.get("name") if isinstance(node, DictConfig) else None
    return f"{key}={choice}" if choice is not None else f"{key} (plugin: {cfg[key].plugin})"


def _instantiate(cls, cfg, name: str):
    try:
        takes_cfg = len(inspect.signature(cls).parameters) > 0
        return cls(cfg) if takes_cfg else cls()
    except TuneupError:
        raise
    except Exception as exc:
        raise PluginError(f"plugin '{name}' failed to start: {_one_line(exc)}") from exc


def _one_line(exc: BaseException) -> str:
    """``Type: message`` on one line: OmegaConf's errors add ``full_key:`` and ``object_type=``
    lines, which would break the command's one ``error:`` line."""
    lines = str(exc).strip().splitlines()
    return type(exc).__name__ + (f": {lines[0]}" if lines else "")


def _culprit(exc: BaseException, impls: list) -> str | None:
    """The plugin whose hook function is deepest in the traceback of ``exc``."""
    codes = {getattr(i.function, "__code__", None): i.plugin_name for i in impls}
    name, tb = None, exc.__traceback__
    while tb is not None:
        name = codes.get(tb.tb_frame.f_code, name)
        tb = tb.tb_next
    return name
