"""Where a run's config comes from: the built-in configs, the user's, and installed plugins'.

Hydra searches these, in this order (for two files of the same name the first wins):

1. tuneup's built-in configs, ``pkg://tuneup.conf`` (``conf/`` in the repository);
2. a folder given with ``--config-dir DIR`` (Hydra's own flag);
3. ``./conf`` in the current directory, so users keep their own groups and presets
   (``conf/experiment/mine.yaml`` -> ``tuneup experiment=mine``) beside their code;
4. the ``conf/`` folder of every installed plugin package (a distribution with an entry
   point in group ``tuneup`` whose top-level package holds ``conf/``).

3 and 4 reach Hydra as ``hydra.searchpath: ${tuneup.searchpath:}`` in conf/config.yaml,
resolved by :func:`searchpath`. Each group an installed plugin ships gets an entry in the
defaults list (:func:`installed_defaults`): ``<group>: off`` when the group has an
``off.yaml``, or what the package's ``conf/defaults.yaml`` lists, so ``tuneup gradclip=on``
works without a ``+`` and the plugin is off until asked for.

Three config nodes only code can make (:func:`register`, run when ``tuneup.conf`` is
imported, i.e. whenever Hydra reads these configs):

- ``_tuneup/installed_plugins``: the installed plugins' defaults, above;
- ``_tuneup/open``: an empty node that is not in struct mode. ``model=custom`` and
  ``data=custom`` start from it, so every key given beside
  ``_target_`` (``model.width=256``) is an argument, without Hydra's ``+``;
- ``_tuneup/lightning``: the same, flagged, for ``model=lightning``: its node is otherwise
  ``model=custom``'s, and the flag lets the checks refuse a plain ``nn.Module`` there.

The folders a given command line reads (and a user's file a built-in one hides): see
config_folders.py. Below, the files read for the checks: the keys they give (what an ``off``
option carries: off_options.py).

Nothing here imports torch: ``tuneup --help`` and config errors stay fast.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
from pathlib import Path

from omegaconf import OmegaConf

from tuneup.trainer.hookspecs import PROJECT

#: The built-in configs, as a Hydra search-path entry and on disk.
BUILTIN = f"pkg://{PROJECT}.conf"
BUILTIN_DIR = Path(__file__).resolve().parent.parent / "conf"
#: The folder of the user's own configs, relative to the current directory.
USER_DIR = "conf"
#: The OmegaConf flag of ``model=lightning``'s node (``_tuneup/lightning``, :func:`register`).
LIGHTNING_FLAG = "tuneup_model_lightning"
#: Groups Hydra owns, never a plugin's or a user's.
HYDRA_GROUP = "hydra"

_extra_dirs: list[Path] = []  # compose(config_dir=...): like --config-dir, for Python callers
_composed_dirs: list[Path] = []  # the config_dir of the last compose, for the checks of its keys


def builtin_dir() -> Path:
    """Where the built-in configs are on disk (the package's ``conf``; ``conf/`` in a checkout)."""
    spec = importlib.util.find_spec(f"{PROJECT}.conf")
    return Path(spec.origin).parent if spec and spec.origin else BUILTIN_DIR


def user_dir(cwd: Path | None = None) -> Path | None:
    """``./conf`` when it exists and is not the built-in configs themselves (a checkout)."""
    folder = (cwd or Path.cwd()) / USER_DIR
    if not folder.is_dir() or folder.resolve() == builtin_dir().resolve():
        return None
    return folder.resolve()


def is_builtin(ep: importlib.metadata.EntryPoint) -> bool:
    """Whether an entry point of group ``tuneup`` is one of tuneup's own plugins."""
    return ep.dist is not None and _name(ep.dist) == PROJECT


@functools.lru_cache(maxsize=256)
def _name(dist: importlib.metadata.Distribution) -> str:
    """A distribution's name, lower-cased, read once per ``Distribution``: its ``name`` parses
    the METADATA file at every read, and the entry points of one ``entry_points()`` call share
    their distribution (tuneup's 23 cost 10 ms a look, two looks a compose)."""
    return dist.name.lower()


def plugin_dir(ep: importlib.metadata.EntryPoint) -> Path | None:
    """The ``conf`` folder of an installed plugin's top-level package, if it ships one.

    Found without importing the plugin (``find_spec`` of a top-level package does not run
    it), so listing configs never pays for a plugin's imports.
    """
    if is_builtin(ep):
        return None
    spec = importlib.util.find_spec(ep.module.split(".")[0])
    for location in (spec.submodule_search_locations or []) if spec else []:
        folder = Path(location) / USER_DIR
        if folder.is_dir():
            return folder.resolve()
    return None


def plugin_dirs() -> dict[str, Path]:
    """Installed plugin name -> its package's ``conf`` folder, for the plugins that ship one."""
    found = {}
    for ep in importlib.metadata.entry_points(group=PROJECT):
        if (folder := plugin_dir(ep)) is not None:
            found[ep.name] = folder
    return found


def searchpath() -> list[str]:
    """Entries 3 and 4 above (and ``compose``'s ``config_dir``), as ``file://`` paths."""
    folders = [*_extra_dirs, user_dir(), *plugin_dirs().values()]
    return [f"file://{folder}" for folder in folders if folder is not None]


def groups(folder: Path) -> dict[str, list[str]]:
    """Config groups in ``folder`` (sub-folders holding .yaml files) and their options."""
    found = {}
    for directory in sorted(p for p in folder.rglob("*") if p.is_dir()):
        name = directory.relative_to(folder).as_posix()
        options = sorted(p.stem for p in directory.glob("*.yaml"))
        if options and name.split("/")[0] != HYDRA_GROUP and "__pycache__" not in name:
            found[name] = options
    return found


def installed_defaults() -> list[dict]:
    """The defaults-list entries of the installed plugins' groups (see module docstring)."""
    folders = plugin_dirs().values()
    builtin = groups(builtin_dir()) if folders else {}  # a walk of conf/: only when needed
    entries: list[dict] = []
    for folder in folders:
        declared = folder / "defaults.yaml"
        if declared.is_file():
            listed = OmegaConf.to_container(OmegaConf.load(declared)).get("defaults") or []
            chosen = {k.lstrip("/"): v for item in listed for k, v in dict(item).items()}
        else:
            chosen = {g: "off" for g, options in groups(folder).items() if "off" in options}
        entries += [{f"/{g}": option} for g, option in chosen.items() if g not in builtin]
    return entries


def tasks_per_node(devices, gpus_per_node) -> int:
    """Slurm tasks per node for ``trainer.devices``: ``auto`` is one per GPU asked for (or 1)."""
    if devices == "auto":
        return int(gpus_per_node or 1)
    return devices if isinstance(devices, int) else len(str(devices).split(","))


def register() -> None:
    """Make the resolver and the code-made nodes known to Hydra (idempotent)."""
    from hydra.core.config_store import ConfigStore

    OmegaConf.register_new_resolver(f"{PROJECT}.searchpath", searchpath, replace=True)
    OmegaConf.register_new_resolver(f"{PROJECT}.tasks_per_node", tasks_per_node, replace=True)
    store = ConfigStore.instance()
    store.store(
        group="_tuneup",
        name="installed_plugins",
        package="_global_",
        node={"defaults": installed_defaults()},
    )
    store.store(group="_tuneup", name="open", node=OmegaConf.create({}, flags={"struct": False}))
    lightning = {"struct": False, LIGHTNING_FLAG: True}  # model=lightning: open, and marked
    store.store(group="_tuneup", name="lightning", node=OmegaConf.create({}, flags=lightning))


def compose(overrides=(), config_dir: str | Path | None = None):
    """The config ``tuneup OVERRIDES`` would train with (``config_dir``: like ``--config-dir``)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module

    _extra_dirs[:] = [Path(config_dir).resolve()] if config_dir is not None else []
    _composed_dirs[:] = _extra_dirs
    try:
        with initialize_config_module(config_module=f"{PROJECT}.conf", version_base="1.3"):
            register()  # plugins installed since the last call are seen
            return hydra_compose("config", overrides=list(overrides))
    finally:
        _extra_dirs.clear()


# -- keys nothing reads: a typo that would train the default (trainer/unread_keys.py, tuneup/cli.py) --


def searched_dirs() -> list[Path]:
    """Every config folder this process's run was composed from (as far as it can be known)."""
    folders = [builtin_dir(), *_composed_dirs, user_dir(), *plugin_dirs().values()]
    try:
        from hydra.core.hydra_config import HydraConfig

        if HydraConfig.initialized():  # --config-dir among them
            sources = HydraConfig.get().runtime.config_sources
            folders += [Path(s.path) for s in sources if s.schema == "file" and s.path]
    except ImportError:
        pass
    return [f for f in folders if f is not None and f.is_dir()]


def top_level_keys(folders: list[Path]) -> set[str]:
    """The top-level keys configs in ``folders`` can give a run: primary configs' keys, each
    group's name, and the keys that presets (``# @package _global_`` files) set."""
    found: set[str] = set()
    for folder in folders:
        for path in folder.rglob("*.yaml"):
            parts = path.relative_to(folder).parts
            if parts[0] == HYDRA_GROUP:
                continue
            stat = path.stat()
            keys = _keys_set(str(path), len(parts) == 1, stat.st_mtime_ns, stat.st_size)
            found |= {parts[0]} if keys is None else keys
    return found


@functools.lru_cache(maxsize=1024)
def _keys_set(path: str, primary: bool, _mtime_ns: int, _size: int) -> frozenset | None:
    """The top-level keys a primary config or a preset sets, None for a group's option (its
    group's name is the key), read once while the file is unchanged (its path, time and
    size): the checks of every trial a study composes read them, and OmegaConf parses YAML
    slowly."""
    if not (primary or _is_global(Path(path))):
        return None
    loaded = OmegaConf.load(path)
    return (
        frozenset(set(loaded.keys()) - {"defaults"}) if OmegaConf.is_dict(loaded) else frozenset()
    )


def _is_global(path: Path) -> bool:
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            return False
        if line.lstrip("# ").startswith("@package"):
            return line.split("@package", 1)[1].strip().startswith("_global_")
    return False
