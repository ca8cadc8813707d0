"""bench/dataloader.py's third part, ``--shards``: JPEGs as a folder against their shards,
read from a cold and a warm page cache (see dataloader.py's docstring)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch


class FileBytes(torch.utils.data.Dataset):
    """The bytes of each image file (their count: nothing to collate)."""

    def __init__(self, paths: list[str]) -> None:
        self.paths = paths

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> int:
        with open(self.paths[index], "rb") as f:
            return len(f.read())


class ShardBytes(torch.utils.data.Dataset):
    """The bytes of each image sample of the shards (tuneup's reader: wids, memory-mapped)."""

    def __init__(self, records) -> None:
        self.records = records

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int) -> int:
        return sum(len(v) for v in self.records[index].values())


def drop_cache(files: list[Path]) -> str:
    """Evict ``files`` from the page cache: the whole cache as root, else each file's pages."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return "drop_caches"
    except OSError:
        for path in files:
            fd = os.open(path, os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
        return "fadvise"


def read_rate(dataset, workers: int, count: int, batch: int) -> dict:
    """Samples/s over ``count`` samples in a shuffled order, and the first batch's wait."""
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(0))[:count]
    loader = torch.utils.data.DataLoader(
        torch.utils.data.Subset(dataset, order.tolist()),
        batch_size=batch,
        num_workers=workers,
        collate_fn=lambda samples: len(samples),
    )
    started = time.perf_counter()
    samples, first = 0, None
    for size in loader:
        samples += size
        if first is None:
            first = time.perf_counter() - started
    seconds = time.perf_counter() - started
    return {"per_worker": samples / seconds / max(1, workers), "first_s": first}


def shards_table(args, tmp: Path, write_images) -> list[str]:
    """The shards table; ``write_images`` (dataloader.py's) writes the JPEG folder."""
    import tuneup
    from tuneup.shards import main as convert
    from tuneup.trainer.components import Plan
    from tuneup.zoo.data.shard_reader import ShardRecords, read_descriptor

    folder, shards = tmp / "folder", tmp / "shards"
    write_images(folder, args.classes, args.shard_images, 64, (500, 375))
    started = time.perf_counter()
    convert([str(folder), str(shards), "--shard-size", args.shard_size, "--quiet"])
    converted = time.perf_counter() - started
    files = sorted(folder.rglob("*.jpg")) + sorted(shards.rglob("*.tar"))
    size = sum(p.stat().st_size for p in files if p.suffix == ".jpg")
    count = len(read_descriptor(shards, "train")["shardlist"])
    print(
        f"{args.shard_images} JPEGs of 500x375 (quality 90, {size / 2**20:.0f} MiB) in "
        f"{args.classes} class folders; converted in {converted:.1f} s into {count} shards of "
        f"at most {args.shard_size}; {args.image_size}-px crops; batch {args.decode_batch}\n"
    )

    def decode_set(name: str, key: str, place: Path):
        cfg = tuneup.compose(
            [
                f"data={name}",
                f"data.{key}={place}",
                "data.decoder=pillow",
                f"data.image_size={args.image_size}",
            ]
        )
        data = Plan(cfg).data
        data.setup()
        return data.train_set

    ways = {
        ("folder", "bytes"): lambda: FileBytes(
            [str(p) for p, _ in decode_set("imagefolder", "root", folder).samples]
        ),
        ("shards", "bytes"): lambda: ShardBytes(
            ShardRecords(shards, read_descriptor(shards, "train"))
        ),
        ("folder", "decode"): lambda: decode_set("imagefolder", "root", folder),
        ("shards", "decode"): lambda: decode_set("shards", "path", shards),
    }
    rows = [
        "| read | from | page cache | workers | samples | set-up (s) | samples/s per worker "
        "| first batch (s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    how = set()
    for (source, what), make in ways.items():
        for workers in args.shard_workers:
            for cache in ("cold", "warm"):
                if cache == "cold":
                    how.add(drop_cache(files))
                started = time.perf_counter()
                dataset = make()  # the folder: its listing; the shards: the descriptor
                setup = time.perf_counter() - started
                count = len(dataset) if what == "bytes" else min(len(dataset), args.shard_decode)
                r = read_rate(dataset, workers, count, args.decode_batch)
                rows.append(
                    f"| {'bytes' if what == 'bytes' else 'decode path'} | {source} "
                    f"| {cache} | {workers} | {count} | {setup:.2f} | {r['per_worker']:,.0f} "
                    f"| {r['first_s']:.2f} |"
                )
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    return [
        *rows,
        "",
        f"cold: {', '.join(sorted(how))}; load average at the end: {load} "
        f"({len(os.sched_getaffinity(0))} CPUs)",
    ]
