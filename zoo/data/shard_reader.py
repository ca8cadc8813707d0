"""A folder of shards as ``tuneup-shards`` writes it: its descriptors, checked, and every
sample of a split read by index. :mod:`tuneup.zoo.data.shards` (``data=shards``) builds its
data sets on these records; ``tuneup-shards`` (:mod:`tuneup.shards`) writes the folder.

The layout is WebDataset's and wids's, so other tools read it too::

    DST/train.json            wids's descriptor of the split: its shards, samples per shard and
                              bytes per shard, plus tuneup's own key (kind, classes, context...)
    DST/train/000000.tar ...  WebDataset tar shards: sample i is <i:08d>.<ext> files in a row
    DST/val.json, DST/val/    the same for validation

A sample is read from its shard by wids's ``IndexedTarSamples`` (the tar's headers indexed
once per shard and process, the bytes read from a memory map), kept lean by
:class:`OpenShard`. Everything that can be wrong on disk (a missing or foreign descriptor, a
missing, half-written or damaged shard) is a :class:`ShardError` naming the file.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np

from tuneup.errors import TuneupError

#: The extra that installs the readers and writers (webdataset, wids).
EXTRA = "tuneup[shards]"
#: tuneup's version of what it keeps in the descriptors (under ``"tuneup"``).
FORMAT = 1
SPLITS = ("train", "val")


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
