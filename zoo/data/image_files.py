"""An image folder's files: finding them (``<split>/<class>/*.jpg``, torchvision's ImageFolder
layout), the dataset that reads them through a transform, and the clock of their decoding.

Used by :mod:`tuneup.zoo.data.image_folder`, :mod:`tuneup.zoo.data.shards` and ``tuneup-shards``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch
from torch.utils.data import Dataset, get_worker_info

from tuneup.errors import TuneupError

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp")


class DecodeClock:
    """Images decoded and seconds spent decoding them, per DataLoader worker.

    A shared-memory table written by the workers (one row each, so no two write the same
    place) and read by the training process at the report: nothing crosses the loader.
    """

    ROWS = 65  # the training process, then workers 0..63 (more workers share the last row)

    def __init__(self) -> None:
        self.table = torch.zeros(self.ROWS, 2, dtype=torch.float64).share_memory_()

    def add(self, seconds: float) -> None:
        worker = get_worker_info()
        row = min(self.ROWS - 1, 0 if worker is None else worker.id + 1)
        self.table[row, 0] += 1
        self.table[row, 1] += seconds

    def figures(self) -> dict:
        images, seconds = self.table.sum(0).tolist()
        busy = int((self.table[:, 0] > 0).sum())
        if not images or not seconds:
            return {}
        return {
            "decoded_images": int(images),
            "decoding_processes": busy,
            "decode_images_per_s_per_worker": images / seconds,
        }


class ImageFiles(Dataset):
    """``(*transform(path), label)`` for a list of ``(path, label)``, each sample timed."""

    def __init__(self, samples: list[tuple[str, int]], transform, clock=None) -> None:
        self.samples, self.transform, self.clock = samples, transform, clock

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int):
        path, label = self.samples[index]
        started = time.perf_counter()
        out = self.transform(path)
        if self.clock is not None:
            self.clock.add(time.perf_counter() - started)
        if isinstance(out, tuple):  # (pixels, flip) or (bytes, flip, box): the label second
            return out[0], label, *out[1:]
        return out, label


def class_folders(split: Path) -> list[str]:
    """Sorted names of the sub-folders of ``split``: the classes."""
    return sorted(e.name for e in os.scandir(split) if e.is_dir())


def image_files(folder: Path):
    """Image files under ``folder`` (recursively), sorted, by extension (any case)."""
    for parent, dirs, files in os.walk(folder, followlinks=True):
        dirs.sort()
        for name in sorted(files):
            if name.lower().endswith(IMAGE_EXTENSIONS):
                yield os.path.join(parent, name)


def find_samples(split: Path, classes: list[str]) -> list[tuple[str, int]]:
    """Every ``(path, class index)`` under ``split``; a class folder unknown to ``classes`` fails."""
    index = {name: i for i, name in enumerate(classes)}
    samples = []
    for name in class_folders(split):
        if name not in index:
            raise TuneupError(
                f"{split / name} is a class folder that train/ does not have; the classes are "
                f"the folders of train/ ({len(classes)}: {', '.join(classes[:5])}...)"
            )
        samples += [(path, index[name]) for path in image_files(split / name)]
    return samples


def _subset(samples: list, count: int | None, seed: int) -> list:
    """At most ``count`` samples, a fixed random choice (all classes, not the first ones)."""
    if count is None or count >= len(samples):
        return samples
    order = torch.randperm(len(samples), generator=torch.Generator().manual_seed(seed))
    return [samples[i] for i in sorted(order[:count].tolist())]
