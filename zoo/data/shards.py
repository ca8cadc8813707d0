"""Data in shards (``data=shards``): WebDataset tar shards, read by random access through wids.

``tuneup-shards SRC DST`` (:mod:`tuneup.shards`) writes them from an image folder or a text
file; the layout is WebDataset's and wids's, so other tools read it too::

    DST/train.json            wids's descriptor of the split: its shards, samples per shard and
                              bytes per shard, plus tuneup's own key (kind, classes, context...)
    DST/train/000000.tar ...  WebDataset tar shards: sample i is <i:08d>.<ext> files in a row
    DST/val.json, DST/val/    the same for validation

An image sample is ``<key>.cls`` (the class index, as text) and the image file's own bytes
under its own suffix (``<key>.jpg``, ``.png``...: encoded, as in the folder); a token sample
is ``<key>.npy``, the ``context + 1`` tokens of one window, as ``data=textfile`` cuts them.

The data set is **map-style**: sample ``i`` of a split is the ``i``-th file of the folder in
``data=imagefolder``'s order (or the ``i``-th window of the text), read from its shard by
wids's ``IndexedTarSamples`` (the tar's headers indexed once per shard and process, the
bytes read from a memory map). So the training order is tuneup's resumable sampler's
(trainer/state/data_order.py) as for every other data set: seeded, sharded over the
data-parallel ranks, and resumed exactly mid-epoch. The images then go through
``data=imagefolder``'s own path (decode in the workers, uint8 to the device, flip and
normalise there): :class:`ShardImages` is an :class:`~tuneup.zoo.data.image_folder.ImageFolder`
whose samples are read from shards instead of files.
"""

from __future__ import annotations

import importlib.util
import io
import json
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
from tuneup.zoo.data.image_checks import _setting_problems
from tuneup.zoo.data.image_files import _subset
from tuneup.zoo.data.image_folder import ImageFolder
from tuneup.zoo.data.transforms import JPEG_SUFFIXES, InMemory

#: The extra that installs the readers and writers (webdataset, wids).
EXTRA = "tuneup[shards]"
#: tuneup's version of what it keeps in the descriptors (under ``"tuneup"``).
FORMAT = 1
SPLITS = ("train", "val")
LABEL = ".cls"
TOKENS = ".npy"


class ShardError(TuneupError):
    """A shard folder, descriptor or shard that cannot be read; the message names the file.

    Raised in a DataLoader worker, torch raises it again in the training process as
    ``ShardError("Caught ShardError in DataLoader worker process 0.\nOriginal Traceback
    ...\n...ShardError: <message>")``: the message is kept, on one line, and the worker named.
    """

    def __init__(self, message: str) -> None:
        lines = message.rstrip().splitlines()
        if len(lines) > 1 and lines[0].startswith("Caught ") and "ShardError: " in lines[-1]:
            where = lines[0].removeprefix(f"Caught {type(self).__name__} ").rstrip(".")
            message = f"{lines[-1].split('ShardError: ', 1)[1]} ({where})"
        super().__init__(message)


def missing_extra(modules=("wids",)) -> str | None:
    """What to install when a module of the extra is missing, else None."""
    absent = [m for m in modules if importlib.util.find_spec(m) is None]
    if not absent:
        return None
    return f"{' and '.join(absent)} not installed: pip install '{EXTRA}'"


def descriptor_path(root: Path, split: str) -> Path:
    return Path(root) / f"{split}.json"


def read_descriptor(root: Path, split: str) -> dict:
    """The split's wids descriptor, checked for what tuneup reads from it."""
    path = descriptor_path(root, split)
    if not path.is_file():
        raise ShardError(
            f"{path} does not exist: not a folder of shards written by "
            f"tuneup-shards (convert with: tuneup-shards SRC {root})"
        )
    try:
        found = json.loads(path.read_text())
        info, shards = found["tuneup"], found["shardlist"]
        if info["format"] != FORMAT or info["kind"] not in ("images", "tokens") or not shards:
            raise ValueError(
                f"format {info['format']} (this tuneup reads {FORMAT}), kind "
                f"{info['kind']!r} (images or tokens), or no shards"
            )
        for shard in shards:
            int(shard["nsamples"]), int(shard["filesize"]), str(shard["url"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ShardError(
            f"{path} is not a tuneup shards descriptor ({type(exc).__name__}: "
            f"{exc}); convert again with tuneup-shards SRC {root}"
        ) from exc
    return found


def shard_problems(root: Path, descriptor: dict) -> list[str]:
    """Shards that are missing, or whose size is not what the descriptor says (half-written,
    cut short in a copy): one ``stat`` per shard, no reading."""
    found = []
    for shard in descriptor["shardlist"]:
        path = Path(root) / shard["url"]
        try:
            size = path.stat().st_size
        except OSError as exc:
            found.append(
                f"{path} cannot be read ({exc.strerror}); copy it again, or convert "
                f"again with tuneup-shards SRC {root}"
            )
            continue
        if size != shard["filesize"]:
            found.append(_wrong_size(path, size, shard["filesize"], root))
    return found


def _wrong_size(path: Path, size: int, expected: int, root) -> str:
    return (
        f"{path} is {size} bytes, not the {expected} its descriptor lists: a half-written or "
        f"damaged shard; copy it again, or convert again with tuneup-shards SRC {root}"
    )


class ShardRecords:
    """Every sample of one split by index: ``{".ext": bytes}`` of the sample's files.

    Each process (a DataLoader worker) opens a shard the first time it reads from it: wids's
    ``IndexedTarSamples`` maps the file and indexes its tar headers (:class:`OpenShard`); it
    stays open. The open shards are not pickled: a worker started by spawn opens its own.
    """

    def __init__(self, root: Path, descriptor: dict) -> None:
        self.root = Path(root)
        self.shards = descriptor["shardlist"]
        self.ends = np.cumsum([s["nsamples"] for s in self.shards])
        self.opened: dict[int, object] = {}

    def __len__(self) -> int:
        return int(self.ends[-1])

    def __getitem__(self, index: int) -> dict[str, bytes]:
        if not 0 <= index < len(self):
            raise IndexError(f"sample {index} of {len(self)}")
        k = int(np.searchsorted(self.ends, index, side="right"))
        inner = index - (int(self.ends[k - 1]) if k else 0)
        shard = self.opened.get(k) or self._open(k)
        return shard[inner]

    def _open(self, k: int):
        from wids.wids import IndexedTarSamples

        desc = self.shards[k]
        path = self.root / desc["url"]
        try:
            size = path.stat().st_size
            if size != desc["filesize"]:
                raise ShardError(_wrong_size(path, size, desc["filesize"], self.root))
            shard = IndexedTarSamples(path=str(path), expected_size=desc["nsamples"])
        except ShardError:
            raise
        except OSError as exc:
            raise ShardError(f"{path} cannot be read ({exc.strerror})") from exc
        except Exception as exc:  # a damaged tar: wids asserts, or the header parse fails
            raise ShardError(
                f"{path} is not a whole WebDataset shard ({type(exc).__name__}: "
                f"{exc}); copy it again, or convert again"
            ) from exc
        self.opened[k] = OpenShard(shard)
        return self.opened[k]

    def __getstate__(self) -> dict:
        return {**self.__dict__, "opened": {}}


class OpenShard:
    """One shard as wids opened it, its index kept in two arrays.

    wids's ``IndexedTarSamples`` keeps the index of the tar headers as Python objects (a dict
    by file name, a list of tuples, a list of lists): about 530 bytes per two-file sample
    (measured, tracemalloc), and every worker keeps every shard open, so 0.7 GB per worker
    for ImageNet's 1.28 million images. Once wids has built it, the files' header offsets
    are kept in an array, with each sample's first file (8 bytes each: 24 per sample), and
    the bytes are read by wids's memory-mapped reader (``get_at_offset``). Should a wids
    release lay its index out otherwise, its own object is used as it is.
    """

    def __init__(self, samples) -> None:
        self.samples = samples
        self.offsets = None
        try:
            reader, groups = samples.reader, samples.samples
            offsets = np.array([offset for _, offset, _ in reader.by_index], dtype=np.int64)
            first = np.array([g[0] for g in groups] + [len(offsets)], dtype=np.int64)
            if not all(g == list(range(g[0], g[0] + len(g))) for g in groups[:1] + groups[-1:]):
                return
            if int(np.diff(first).sum()) != len(offsets) or (np.diff(first) < 1).any():
                return
        except (AttributeError, TypeError, IndexError):
            return
        self.reader, self.offsets, self.first = reader, offsets, first
        reader.by_name, reader.by_index, samples.samples = {}, [], []  # the objects, freed

    def __getitem__(self, index: int) -> dict[str, bytes]:
        if self.offsets is None:
            found = self.samples[index]
            return {ext: value.getvalue() for ext, value in found.items() if ext.startswith(".")}
        from wids.wids import splitname

        found = {}
        for i in range(int(self.first[index]), int(self.first[index + 1])):
            name, data = self.reader.get_at_offset(int(self.offsets[i]))
            found[splitname(name)[1]] = bytes(data)
        return found


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
