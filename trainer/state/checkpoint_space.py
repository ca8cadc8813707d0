"""The space a checkpoint takes, and a warning when the next one will not fit (said when training
starts, not found out at the first save, up to ``checkpoint.every_n_minutes`` later)."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch


def stored_bytes(path: Path) -> int:
    """Bytes a checkpoint takes on disk: a file, or a sharded checkpoint's directory."""
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size


def next_checkpoint_bytes(resumed: Path | None, module) -> tuple[int, str]:
    """About how many bytes the next checkpoint takes, and where the figure comes from: the
    checkpoint resumed from, else the weights and an optimizer state up to twice their size
    (Adam's two moments; the optimizer's state does not exist before its first step)."""
    if resumed is not None and resumed.exists():
        return stored_bytes(resumed), f"the size of {resumed.name}"
    weights = sum(
        t.numel() * t.element_size() for t in module.state_dict().values() if torch.is_tensor(t)
    )
    return 3 * weights, "estimated: the weights and an optimizer state up to twice their size"


def free_bytes(directory: Path) -> int:
    """Free bytes on the file system ``directory`` is (or will be) on."""
    existing = next(p for p in (directory, *directory.parents) if p.exists())
    return shutil.disk_usage(existing).free


def space_warning(directory: Path, needed: int, source: str) -> str | None:
    """What to say when the next checkpoint will not fit on the file system; None if it will."""
    free = free_bytes(directory)
    if free >= needed:
        return None
    return (
        f"only {free / 2**20:.1f} MiB free on the file system of {directory}, but the next "
        f"checkpoint needs about {needed / 2**20:.1f} MiB ({source}): it will fail when it is "
        "written. Free space, keep fewer (checkpoint.keep_last), or give the run a larger "
        "file system: hydra.run.dir=<directory>"
    )
