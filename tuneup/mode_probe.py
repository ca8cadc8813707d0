"""One composition of the config a command, not two, where the answer to Hydra's probe is known.

Hydra 1.3 composes the whole config twice for every command: once (``Hydra.get_mode``) only to
read ``hydra.mode``, which a config may set to ``MULTIRUN`` (a sweep without ``-m``), then again
for the run. The probe is half of what a config error costs and a fifth of a tiny run's CPU
(0.13-0.25 s a command here; docs/benchmarks.md, Start-up): every command, DDP rank, sweep job
and Slurm task pays it.

Its answer is known without composing when nothing the command can read sets ``hydra.mode``:
- the only config folder is the built-in one (no ``--config-dir``, no ``./conf``, no installed
  plugin's configs: :func:`tuneup.trainer.config_folders.config_dirs`), and none of the built-in configs sets it
  (tests/test_mode_probe.py reads them all);
- no command-line override names ``hydra.mode`` or ``hydra.searchpath``, and no other primary
  config (``--config-name``) or config path is asked for;
- no Hydra search-path plugin adds folders, and no node in Hydra's ConfigStore (Hydra's own,
  installed Hydra plugins', tuneup's) sets it.

Then the probe's answer is ``None``, as ``get_mode`` returns for a config that leaves the mode
unset, and Hydra goes on as it would: a run, or a sweep with ``-m``. In every other case the
probe runs as before.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

#: Overrides that can set the mode, or add folders whose configs could.
_MODE_KEYS = ("hydra.mode", "hydra.searchpath")
#: Options that choose another primary config or folder than the built-in ``config``.
_OTHER_CONFIG = ("--config-name", "-cn", "--config-path", "-cp", "--config-dir", "-cd")


@contextlib.contextmanager
def without_needless_probe(argv: list[str]) -> Iterator[None]:
    """While the command runs, Hydra's mode probe answers ``None`` without composing where
    :func:`probe_is_needless` holds for ``argv``."""
    from hydra._internal.hydra import Hydra

    probe = Hydra.get_mode

    def get_mode(self, config_name, overrides):
        if config_name == "config" and probe_is_needless(argv):
            return None
        return probe(self, config_name, overrides)

    Hydra.get_mode = get_mode
    try:
        yield
    finally:
        Hydra.get_mode = probe


def probe_is_needless(argv: list[str]) -> bool:
    """Whether nothing ``argv`` can read sets ``hydra.mode`` (the module's docstring)."""
    from tuneup.trainer import config_folders

    if any(arg.split("=")[0] in _OTHER_CONFIG for arg in argv):
        return False
    keys = [arg.split("=")[0].lstrip("+~") for arg in argv if not arg.startswith("-")]
    if any(key.startswith(_MODE_KEYS) for key in keys):
        return False
    if len(list(config_folders.config_dirs(argv))) > 1:
        return False
    return not _search_path_plugins() and not _stored_modes()


def _search_path_plugins() -> list[str]:
    """Hydra search-path plugins other than Hydra's own (each may add config folders)."""
    from hydra.core.plugins import Plugins
    from hydra.plugins.search_path_plugin import SearchPathPlugin

    found = Plugins.instance().discover(SearchPathPlugin)
    return [p.__module__ for p in found if not p.__module__.startswith("hydra.")]


def _stored_modes() -> list[str]:
    """The ConfigStore nodes that set ``hydra.mode``, as ``group/name``."""
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    found = []

    def walk(tree: dict, group: str) -> None:
        for name, item in tree.items():
            if isinstance(item, dict):
                walk(item, f"{group}/{name}" if group else name)
                continue
            package = item.package if item.package is not None else group.replace("/", ".")
            package = package.removeprefix("_global_").lstrip(".")
            key = {"": "hydra.mode", "hydra": "mode", "hydra.mode": ""}.get(package)
            if key is None:  # a package elsewhere (hydra.launcher, optimizer...)
                continue
            value = (
                item.node
                if not key
                else OmegaConf.select(
                    item.node, key, default=None, throw_on_resolution_failure=False
                )
            )
            if value is not None:
                found.append(f"{group}/{name}")

    walk(ConfigStore.instance().repo, "")
    return found
