"""Each YAML file of a config folder parsed once per test process, not once per composition.

Every Hydra composition reads and parses each YAML file it takes again (PyYAML, then
OmegaConf's nodes): a large share of a composition's time, paid at every one of the suite's
compositions, in the workers and in the commands the zygote (tests/warm.py) forks. :func:`install` wraps the
``load_config`` of Hydra's two file sources (``file://`` and ``pkg://``) so that a file whose
text was parsed before is not parsed again: the cache is keyed by the file's text, read at
every load, so an edited file, a test's own ``conf/`` or ``--config-dir`` folder, and an
installed copy are seen as they are. Each load gets its own deep copy of the parsed config
(Hydra changes what it loads), with the header the original reads. A file that cannot be
read as text (a zipped package) takes Hydra's own path.

Standard library and Hydra only: the zygote installs it before it forks (:func:`preload`).
"""

from __future__ import annotations

import copy
import functools
import io
from pathlib import Path

#: text of a config file -> (its parsed config, its header): never handed out, only copies.
_PARSED: dict[str, tuple] = {}


def install() -> None:
    """Wrap the ``load_config`` of the file sources Hydra uses (idempotent). Hydra's plugin
    scan executes its core plugins' modules again, making new classes: the sources are wrapped
    as its registry of sources takes them, and those it holds already now."""
    from hydra._internal.sources_registry import SourcesRegistry

    for source in list(SourcesRegistry.instance().types.values()):
        _wrap(source)
    if getattr(SourcesRegistry.register, "parsed_once", False):
        return
    register = SourcesRegistry.register

    @functools.wraps(register)
    def register_wrapped(self, type_) -> None:
        register(self, type_)
        _wrap(self.types.get(type_.scheme()))

    register_wrapped.parsed_once = True
    SourcesRegistry.register = register_wrapped


def _wrap(source) -> None:
    """A ``file://`` or ``pkg://`` source's ``load_config`` through the cache."""
    text_of = {"file": _file_text, "pkg": _resource_text}.get(source.scheme() if source else "")
    if text_of is not None and not getattr(source.load_config, "parsed_once", False):
        source.load_config = _cached(source.load_config, text_of)


def preload(folder: Path) -> None:
    """Parse every YAML file under ``folder`` now (the zygote: its children find them)."""
    for path in sorted(folder.rglob("*.yaml")):
        _parsed(path.read_text(encoding="utf-8"))


def _cached(load_config, text_of):
    @functools.wraps(load_config)
    def cached_load_config(self, config_path: str):
        from hydra.plugins.config_source import ConfigResult

        try:
            text = text_of(self, self._normalize_file_name(config_path))
        except (OSError, UnicodeDecodeError, ValueError, TypeError):
            text = None
        if text is None:  # missing or not a plain file: Hydra's own error or reading
            return load_config(self, config_path)
        config, header = _parsed(text)
        return ConfigResult(
            config=copy.deepcopy(config),
            path=f"{self.scheme()}://{self.path}",
            provider=self.provider,
            header=dict(header),
        )

    cached_load_config.parsed_once = True
    return cached_load_config


def _parsed(text: str) -> tuple:
    """The config and header Hydra's sources make of ``text`` (``OmegaConf.load`` of the file,
    the header from its first 512 characters), made once."""
    if text not in _PARSED:
        from hydra.plugins.config_source import ConfigSource
        from omegaconf import OmegaConf

        _PARSED[text] = (
            OmegaConf.load(io.StringIO(text)),
            ConfigSource._get_header_dict(text[:512]),
        )
    return _PARSED[text]


def _file_text(source, name: str) -> str | None:
    """The text of a ``file://`` source's file, None where there is no such file."""
    import os

    path = os.path.realpath(os.path.join(source.path, name))
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return f.read()


def _resource_text(source, name: str) -> str | None:
    """The text of a ``pkg://`` source's file, None where it is not a file on disk."""
    from importlib import resources

    resource = resources.files(source.path).joinpath(name)
    if not isinstance(resource, Path) or not resource.is_file():
        return None
    return resource.read_text(encoding="utf-8")
