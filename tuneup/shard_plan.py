"""Which samples go into which shard, for ``tuneup-shards`` (shards.py): an image folder's
files or a text file's windows, in the order tuneup reads them (``data=imagefolder``'s sorted
files, ``data=textfile``'s windows), cut into consecutive shards by their bytes in the tar.

Planned before anything is written, so that a conversion run again after an interruption can
tell from the plan (its shards, the source's fingerprint) which shards it keeps.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from tuneup.errors import TuneupError

#: tar bytes a sample costs beyond its data: a 512-byte header per file, padding to 512 bytes.
SAMPLE_OVERHEAD = 1536


@dataclass
class Shard:
    """One shard to write: its split and number, and what goes into it."""

    split: str
    number: int
    start: int  # index of its first sample in the split
    items: list = field(default_factory=list)  # images: (path, label); text: window indices

    @property
    def url(self) -> str:
        return f"{self.split}/{self.number:06d}.tar"

    @property
    def nsamples(self) -> int:
        """How many samples it holds (its descriptor's ``nsamples``)."""
        if self.items and isinstance(self.items[0], tuple):
            return len(self.items)
        return self.items[2] - self.items[1]


def cut(sizes: list[int], limit: int) -> list[tuple[int, int]]:
    """Consecutive ``(start, end)`` ranges whose sizes add up to at most ``limit`` (one at least)."""
    ranges, start, total = [], 0, 0
    for i, size in enumerate(sizes):
        if i > start and total + size > limit:
            ranges.append((start, i))
            start, total = i, 0
        total += size
    if start < len(sizes):
        ranges.append((start, len(sizes)))
    return ranges


def plan_images(src: Path, args) -> tuple[list[Shard], dict, list]:
    """Shards of an image folder's train/ and val/, and what the descriptors keep."""
    from tuneup.zoo.data.image_files import class_folders, find_samples

    for split in ("train", "val"):
        if not (src / split).is_dir():
            raise TuneupError(
                f"{src / split} does not exist: an image folder holds train/ and "
                "val/, one folder of images per class in each"
            )
    classes = class_folders(src / "train")
    shards, formats, fingerprint = [], {}, []
    for split in ("train", "val"):
        samples = find_samples(src / split, classes)
        if not samples:
            raise TuneupError(f"{src / split} holds no image file in a class folder")
        sizes = [os.stat(path).st_size for path, _ in samples]
        fingerprint += [
            (os.path.relpath(p, src), s) for (p, _), s in zip(samples, sizes, strict=True)
        ]
        for number, (start, end) in enumerate(
            cut([s + SAMPLE_OVERHEAD for s in sizes], args.shard_size)
        ):
            shards.append(Shard(split, number, start, samples[start:end]))
        formats[split] = dict(Counter("jpg" if args.resize else suffix(p) for p, _ in samples))
    info = {"kind": "images", "classes": classes, "resize": args.resize}
    return shards, {**info, "formats": formats}, fingerprint


def plan_text(src: Path, args) -> tuple[list[Shard], dict, list]:
    """Shards of a text file's windows (``data=textfile``'s: ``context + 1`` bytes each)."""
    from tuneup.zoo.data.tokens import BYTE_VOCAB, split_point

    size = src.stat().st_size
    split_at = split_point(size, args.val_fraction)
    parts = {"train": (0, split_at), "val": (split_at, size)}
    per_sample = args.context + 1 + 128 + SAMPLE_OVERHEAD  # .npy header, tar header, padding
    shards = []
    for split, (begin, end) in parts.items():
        windows = (end - begin - 1) // args.context
        if windows < 1:
            raise TuneupError(
                f"{src} has {size} bytes: its {split} part ({end - begin} bytes, "
                f"--val-fraction {args.val_fraction}) is shorter than one window "
                f"of --context {args.context} + 1"
            )
        for number, (start, stop) in enumerate(cut([per_sample] * windows, args.shard_size)):
            shards.append(Shard(split, number, start, [begin, start, stop]))
    info = {
        "kind": "tokens",
        "context": args.context,
        "vocab_size": BYTE_VOCAB,
        "val_fraction": args.val_fraction,
    }
    return shards, info, [size, int(src.stat().st_mtime)]


def suffix(path: str) -> str:
    return os.path.splitext(path)[1].lower().lstrip(".")
