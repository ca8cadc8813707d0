"""Data in shards (``data=shards``): WebDataset tar shards, read by random access through wids.

``tuneup-shards SRC DST`` (:mod:`tuneup.shards`) writes them from an image folder or a text
file; :mod:`tuneup.zoo.data.shard_reader` reads the folder (its layout, its descriptors, each
sample by index). This module makes the data sets of those samples.

An image sample is ``<key>.cls`` (the class index, as text) and the image file's own bytes
under its own suffix (``<key>.jpg``, ``.png``...: encoded, as in the folder); a token sample
is ``<key>.npy``, the ``context + 1`` tokens of one window, as ``data=textfile`` cuts them.

The data set is **map-style**: sample ``i`` of a split is the ``i``-th file of the folder in
``data=imagefolder``'s order (or the ``i``-th window of the text), read from its shard by
:class:`~tuneup.zoo.data.shard_reader.ShardRecords`. So the training order is tuneup's
resumable sampler's (trainer/state/data_order.py) as for every other data set: seeded,
sharded over the data-parallel ranks, and resumed exactly mid-epoch. The images then go
through ``data=imagefolder``'s own path (decode in the workers, uint8 to the device, flip
and normalise there): :class:`ShardImages` is an
:class:`~tuneup.zoo.data.image_folder.ImageFolder` whose samples are read from shards
instead of files.
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf
from torch.utils.data import Dataset

from tuneup.errors import TuneupError
from tuneup.trainer.datamodule import DataModule
from tuneup.trainer.validation import Integer, problems
from tuneup.zoo.data.decoders import JPEG_SUFFIXES, InMemory
from tuneup.zoo.data.image_checks import _setting_problems
from tuneup.zoo.data.image_files import _subset
from tuneup.zoo.data.image_folder import ImageFolder
from tuneup.zoo.data.shard_reader import (
    SPLITS,
    ShardError,
    ShardRecords,
    missing_extra,
    read_descriptor,
    shard_problems,
)

LABEL = ".cls"
TOKENS = ".npy"


class ImageSamples(Sequence):
    """``(InMemory image, label)`` of the ``indices`` of a split: what
    :class:`~tuneup.zoo.data.image_files.ImageFiles` takes in place of ``(path, label)``."""

    def __init__(self, records: ShardRecords, indices: Sequence[int]) -> None:
        self.records, self.indices = records, indices

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i):
        record = self.records[self.indices[i]]
        (suffix,) = [ext for ext in record if ext != LABEL]
        return InMemory(record[suffix], suffix), int(record[LABEL])


class TokenWindows(Dataset):
    """``(tokens[:-1], tokens[1:])`` of each stored window, int64, as ``data=textfile`` gives."""

    def __init__(self, records: ShardRecords, count: int | None = None) -> None:
        self.records = records
        self.count = len(records) if count is None else min(count, len(records))

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int):
        if index >= self.count:
            raise IndexError(index)
        tokens = np.load(io.BytesIO(self.records[index][TOKENS]))
        chunk = torch.from_numpy(tokens.astype(np.int64))
        return chunk[:-1], chunk[1:]


class Shards(DataModule):
    """``data=shards``: images or tokens, as the shards say (:class:`ShardImages` or
    :class:`ShardTokens` is what ``Shards(settings)`` makes)."""

    inputs = None  # the shards say: each instance is ShardImages or ShardTokens

    def __new__(cls, settings=None, configure_loader=None):  # no settings: a copy, unpickled
        if cls is Shards and settings is not None:
            kind = read_descriptor(_root(settings.path), "train")["tuneup"]["kind"]
            cls = ShardImages if kind == "images" else ShardTokens
        return super().__new__(cls)

    @classmethod
    def problems(cls, cfg) -> list[str]:
        missing = missing_extra()
        if missing:
            return [f"data=shards reads WebDataset shards through wids, {missing}"]
        path = OmegaConf.select(cfg, "data.path", throw_on_missing=False)
        if not path:
            return [
                "data.path is not set: give the folder tuneup-shards wrote, e.g. "
                "data.path=/data/imagenet-shards"
            ]
        root, where = _root(path), f"data.path={str(path)!r}"
        if not root.is_dir():
            return [
                f"{where}: {root} does not exist; convert an image folder or a text file "
                f"into it first: tuneup-shards SRC {path}"
            ]
        found, train = [], None
        for split in SPLITS:
            try:
                descriptor = read_descriptor(root, split)
            except ShardError as exc:
                found.append(f"{where}: {exc}")
                if split == "train":  # not a folder of shards at all: one line says it
                    return found
                continue
            found += [f"{where}: {p}" for p in shard_problems(root, descriptor)]
            train = descriptor if split == "train" else train
        if train is None:
            return found
        kind = ShardImages if train["tuneup"]["kind"] == "images" else ShardTokens
        found += problems(cfg, kind.rules)
        if kind is ShardImages:
            found += _setting_problems(cfg.data)
        count = sum(s["nsamples"] for s in train["shardlist"])
        wanted, batch = cfg.data.get("train_samples"), cfg.data.get("batch_size")
        if isinstance(wanted, int) and wanted < count:
            count = wanted
        if not found and isinstance(batch, int) and count < batch:
            found.append(
                f"{where} has {count} training samples, fewer than "
                f"data.batch_size={batch}: no full batch; lower the batch size"
            )
        return found

    def records(self, split: str) -> tuple[ShardRecords, dict]:
        descriptor = read_descriptor(self.root, split)
        return ShardRecords(self.root, descriptor), descriptor["tuneup"]


class ShardImages(Shards, ImageFolder):
    """Images from shards: ``data=imagefolder`` with samples read from shards, not files."""

    inputs = "images"
    rules = {**ImageFolder.rules}

    @staticmethod
    def place(settings) -> str:
        return settings.path

    def find_classes(self) -> list[str]:
        return list(read_descriptor(self.root, "train")["tuneup"]["classes"])

    @property
    def where(self) -> str:
        return f"data.path={str(self.settings.path)!r}"

    def split_samples(self, split: str, count: int | None) -> ImageSamples:
        records, _ = self.records(split)
        return ImageSamples(records, _subset(range(len(records)), count, self.settings.seed))

    def jpeg_only(self, train, val) -> None:
        for split in SPLITS:
            formats = self.records(split)[1]["formats"]
            others = {ext: n for ext, n in formats.items() if not ext.endswith(JPEG_SUFFIXES)}
            if others:
                raise TuneupError(
                    f"data.decoder=nvjpeg decodes JPEG only, and {self.where} "
                    f"{split} holds other images ({others}); use "
                    "data.decoder=pillow"
                )

    def _name_steps(self) -> None:
        super()._name_steps()
        self.worker_steps.insert(0, "read from shard")


class ShardTokens(Shards):
    """Token windows from shards that ``tuneup-shards`` cut from a text file."""

    inputs = "tokens"
    rules = {
        "data.batch_size": Integer(low=1),
        "data.train_samples": Integer(low=1, also=(None,), note="None: every window"),
        "data.val_samples": Integer(low=1, also=(None,), note="None: every window"),
    }

    def __init__(self, settings, configure_loader=None) -> None:
        super().__init__(settings, configure_loader)
        self.root = _root(settings.path)
        info = read_descriptor(self.root, "train")["tuneup"]
        self.input_shape = (info["context"],)
        self.num_classes = info["vocab_size"]

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        s = self.settings
        self.train_set = TokenWindows(self.records("train")[0], s.train_samples)
        self.val_set = TokenWindows(self.records("val")[0], s.val_samples)

    def describe(self) -> dict:
        return {
            "data": "shards",
            "batches": "int64 tokens",
            "worker": "read from shard",
            "device": "copy",
            **self.loading,
        }


def _root(path) -> Path:
    return Path(os.path.expanduser(str(path)))
