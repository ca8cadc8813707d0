"""What ``--plugins`` prints and which installed plugins a run leaves out: the listing of a
run's :class:`~tuneup.trainer.plugin_manager.PluginManager` (active plugins and their sources,
the ones switched off with the choice that switches each on, every hook's implementations in
call order). It reads the manager that plugin_manager.py builds; the runner prints it."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from tuneup.trainer import hookspecs
from tuneup.trainer.plugin_selection import REQUIRED, entry_points, switched_by_config


def switched_off(manager, cfg) -> dict[str, str]:
    """Installed plugins (built-in ones too) this run leaves out -> why, and the setting
    that switches each on."""
    from tuneup.trainer.config import searched_dirs

    switches = _switches(searched_dirs())
    settings = cfg.get("plugins") or {}
    off = {}
    for name, ep in entry_points().items():
        if manager.has_plugin(name) or name in REQUIRED:
            continue
        if name in (settings.get("disable") or []):
            off[name] = "disabled: remove it from plugins.disable"
        elif switched_by_config(ep):
            off[name] = "on with: " + (" | ".join(switches.get(name, [])) or f"{name}.plugin")
        else:
            off[name] = "always-on plugins are off: plugins.autoload=true (and no "
            off[name] += "TUNEUP_DISABLE_PLUGIN_AUTOLOAD)"
    return off


def listing(manager, cfg) -> str:
    """Human-readable: active plugins, where they come from, their hooks in call order."""
    lines = ["Active plugins:"]
    settings = manager.describe(cfg)
    for name in sorted(manager.sources):
        lines.append(f"  {name:<24} {manager.sources[name]}")
        if settings.get(name):
            lines.append(f"  {'':<24} settings: {settings[name]}")
    off = switched_off(manager, cfg)
    if off:
        lines += ["", "Installed, switched off (and what switches each on):"]
        lines += [f"  {name:<24} {how}" for name, how in sorted(off.items())]
    lines.append("")
    lines.append("Hooks (implementations in call order, first runs first):")
    for hook_name in _spec_order():
        impls = manager.call_order(hook_name)
        if impls:
            lines.append(f"  {hook_name:<26} " + " -> ".join(_label(i) for i in impls))
    return "\n".join(lines)


def _switches(folders) -> dict[str, list[str]]:
    """Plugin name -> the config choices that switch it on (``compile=on``): every option file
    in ``folders`` holding ``plugin: <name>``."""
    import re

    from tuneup.trainer.config import builtin_dir

    defaults = OmegaConf.load(builtin_dir() / "config.yaml").get("defaults") or []
    lists = {
        k
        for d in defaults
        if isinstance(d, DictConfig)
        for k, v in d.items()
        if OmegaConf.is_list(v)
    }  # kernels=[cross_entropy]
    found: dict[str, list[str]] = {}
    for folder in folders:
        for path in sorted(folder.rglob("*.yaml")):
            parts = path.relative_to(folder).parts
            if len(parts) < 2 or parts[0] in ("hydra", "experiment", "ablation"):
                continue
            for name in re.findall(r"(?m)^\s*plugin:\s*([\w-]+)", path.read_text(encoding="utf-8")):
                group = "/".join(parts[:-1])
                choice = f"{group}=[{path.stem}]" if group in lists else f"{group}={path.stem}"
                if choice not in found.setdefault(name, []):
                    found[name].append(choice)
    return found


def _label(impl) -> str:
    flags = [f for f in ("tryfirst", "trylast") if getattr(impl, f)]
    return impl.plugin_name + (f" ({', '.join(flags)})" if flags else "")


def _spec_order() -> list[str]:
    return [n for n, f in vars(hookspecs).items() if callable(f) and hasattr(f, "tuneup_spec")]
