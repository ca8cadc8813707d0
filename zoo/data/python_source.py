"""``data=python_source``: the Python standard library's own source, a real text corpus on every machine.

The ``.py`` files under ``sysconfig.get_paths()["stdlib"]`` (``site-packages`` and
``dist-packages`` left out: they differ between machines), walked in sorted order and
concatenated up to ``data.max_bytes``: a few megabytes of real code that no one here
wrote, nothing downloaded, the same for every run on the same Python version. From there
it is ``data=textfile`` (:class:`~tuneup.zoo.data.tokens.TextFile`): byte-level tokens, the
first ``1 - val_fraction`` trains, the rest validates, cut into ``context``-byte windows,
for ``model=gpt`` to reach a validation-loss target.
"""

from __future__ import annotations

import os
import sysconfig
from pathlib import Path

import torch

from tuneup.trainer.validation import Integer, problems
from tuneup.zoo.data.tokens import TextFile, Windows, split_point

#: Third-party packages can sit inside the standard library's folder; they are not its source.
SKIPPED = ("site-packages", "dist-packages", "__pycache__")


def stdlib() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def source_files(root: Path):
    """The ``.py`` files under ``root``, sorted (folders and names), third-party folders skipped."""
    for parent, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED)
        for name in sorted(files):
            if name.endswith(".py"):
                yield Path(parent) / name


def read_source(root: Path, max_bytes: int) -> tuple[bytes, int]:
    """The files' bytes concatenated, cut at ``max_bytes``; and how many files that took."""
    parts, size, files = [], 0, 0
    for path in source_files(root):
        if size >= max_bytes:
            break
        data = path.read_bytes()
        parts.append(data)
        size += len(data)
        files += 1
    return b"".join(parts)[:max_bytes], files


def corpus_size(root: Path, max_bytes: int) -> int:
    """Bytes the corpus will have (file sizes only, nothing read)."""
    size = 0
    for path in source_files(root):
        size += path.stat().st_size
        if size >= max_bytes:
            return max_bytes
    return size


def split_problems(settings, size: int) -> list[str]:
    """A corpus of ``size`` bytes too short for one validation window or one training batch."""
    context, batch = settings.context, settings.batch_size
    cut = split_point(size, settings.val_fraction)
    train = (cut - 1) // context
    if size - cut < context + 1 or train < batch:
        return [
            f"data=python_source: {size} bytes (data.max_bytes={settings.max_bytes}) give "
            f"{train} training windows of data.context={context} and "
            f"{(size - cut - 1) // context} for validation; need data.batch_size={batch} "
            "and 1: raise data.max_bytes, or shorten the context"
        ]
    return []


class PythonSource(TextFile):
    rules = {
        **TextFile.rules,
        "data.max_bytes": Integer(low=1024),
    }

    def __init__(self, settings, configure_loader=None) -> None:
        super().__init__(settings, configure_loader)
        self.files = 0
        self.bytes = 0

    @classmethod
    def problems(cls, cfg) -> list[str]:
        found = problems(cfg, cls.rules)
        if found:
            return found
        root = stdlib()
        size = corpus_size(root, cfg.data.max_bytes)
        if size == 0:
            return [
                f"data=python_source found no .py files under {root} (the standard library "
                "of this Python); use data=textfile data.path=<a text file>"
            ]
        return split_problems(cfg.data, size)

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        s = self.settings
        data, self.files = read_source(stdlib(), s.max_bytes)
        self.bytes = len(data)
        tokens = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        cut = split_point(len(tokens), s.val_fraction)
        self.train_set = Windows(tokens[:cut], s.context, s.train_samples)
        self.val_set = Windows(tokens[cut:], s.context, s.val_samples)

    def describe(self) -> dict:
        found = {**super().describe(), "data": "python_source", "root": str(stdlib())}
        if self.files:
            found.update(files=self.files, bytes=self.bytes)
        return found
