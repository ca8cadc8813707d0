"""``tuneup-shards SRC DST``: an image folder or a text file into shards for ``data=shards``.

The shards are WebDataset tar files written with webdataset's ``TarWriter``, described per
split by a wids descriptor (``DST/train.json``, ``DST/val.json``); the layout is in
:mod:`tuneup.zoo.data.shard_reader`. The order of the samples is the source's as tuneup reads it
(``data=imagefolder``'s sorted files, ``data=textfile``'s windows), so sample ``i`` is the
same in both and a run over the shards can be compared with one over the source.

The work is planned first (which samples go into which shard, by their bytes: shard_plan.py),
then each shard is written by a worker process to a temporary name and renamed when whole. Run
again after an interruption, it keeps the shards already there and writes the others; the plan is
recorded in ``DST/.tuneup-shards.json`` and must be the same (source files, sizes, options).
The descriptors are written last: a folder with them is complete.

    tuneup-shards /data/imagenet /data/imagenet-shards                 # JPEG bytes as they are
    tuneup-shards /data/imagenet /data/imagenet-160 --resize 160       # re-encoded, shorter side 160
    tuneup-shards input.txt /data/text-shards --context 256            # data=textfile's windows
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import math
import os
import re
import sys
from concurrent.futures import FIRST_EXCEPTION, ProcessPoolExecutor, wait
from pathlib import Path

from tuneup import TuneupError
from tuneup.shard_plan import Shard, plan_images, plan_text, suffix

PLAN = ".tuneup-shards.json"
UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
}


def parse_size(text: str) -> int:
    match = re.fullmatch(r"\s*([0-9.]+)\s*([A-Za-z]*)\s*", text)
    if not match or match.group(2).upper() not in UNITS or float(match.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size: e.g. 256MB, 1GB, 64MiB")
    return int(float(match.group(1)) * UNITS[match.group(2).upper()])


# --- writing a shard (in a worker) -----------------------------------------------------------


def write_shard(shard: Shard, src: str, dst: str, args) -> tuple[str, int]:
    """Write one whole shard under a temporary name, then rename it into place."""
    from webdataset import TarWriter

    final = Path(dst) / shard.url
    temporary = final.with_name(f".{final.name}.tmp-{os.getpid()}")
    with open(temporary, "wb") as stream, TarWriter(stream, encoder=False, mtime=0) as writer:
        for key, sample in samples_of(shard, src, args):
            writer.write({"__key__": f"{key:08d}", **sample})
    with open(temporary, "rb+") as stream:
        os.fsync(stream.fileno())
    os.replace(temporary, final)
    return shard.url, final.stat().st_size


def samples_of(shard: Shard, src: str, args):
    """``(index in the split, {extension: bytes})`` of every sample of ``shard``."""
    if shard.items and isinstance(shard.items[0], tuple):
        for i, (path, label) in enumerate(shard.items):
            try:
                data, suffix = image_bytes(path, args)
            except (OSError, ValueError) as exc:  # unreadable, or not an image Pillow reads
                raise TuneupError(f"{path} cannot be read: {type(exc).__name__}: {exc}") from exc
            yield shard.start + i, {suffix: data, "cls": str(label).encode()}
        return
    import numpy as np

    begin, start, stop = shard.items
    with open(src, "rb") as f:
        f.seek(begin + start * args.context)
        data = f.read((stop - start) * args.context + 1)
    tokens = np.frombuffer(data, dtype=np.uint8)
    for i in range(stop - start):
        window = tokens[i * args.context : (i + 1) * args.context + 1]
        buffer = io.BytesIO()
        np.save(buffer, window)
        yield start + i, {"npy": buffer.getvalue()}


def image_bytes(path: str, args) -> tuple[bytes, str]:
    """The file's bytes as they are, or with ``--resize``, re-encoded as JPEG, shorter side
    at most ``args.resize`` pixels."""
    if not args.resize:
        with open(path, "rb") as f:
            return f.read(), suffix(path)
    from PIL import Image

    with Image.open(path) as img:
        scale = args.resize / min(img.size)
        img.draft("RGB", (math.ceil(img.size[0] * scale), math.ceil(img.size[1] * scale)))
        img = img.convert("RGB")
        if scale < 1:
            size = (max(1, round(img.size[0] * scale)), max(1, round(img.size[1] * scale)))
            img = img.resize(size, Image.Resampling.LANCZOS)
        out = io.BytesIO()
        img.save(out, format="JPEG", quality=args.quality)
    return out.getvalue(), "jpg"


# --- the whole conversion ----------------------------------------------------------------------


def convert(src: Path, dst: Path, args) -> dict:
    """Write ``dst`` from ``src``; returns what was done (shards written and kept)."""
    from tqdm import tqdm

    planner = plan_images if src.is_dir() else plan_text
    shards, info, fingerprint = planner(src, args)
    record = {
        "source": str(src.resolve()),
        "info": info,
        "shard_size": args.shard_size,
        "context": args.context,
        "val_fraction": args.val_fraction,
        "quality": args.quality,
    }
    record["digest"] = hashlib.sha256(json.dumps([record, fingerprint]).encode()).hexdigest()
    prepare(dst, record)
    done = {s.url: (dst / s.url).stat().st_size for s in shards if (dst / s.url).exists()}
    todo = [s for s in shards if s.url not in done]
    counts = {s.url: s.nsamples for s in shards}
    bar = tqdm(
        total=sum(counts.values()),
        initial=sum(counts[u] for u in done),
        unit="sample",
        desc=f"{src.name} -> {dst.name}",
        disable=args.quiet,
    )
    with ProcessPoolExecutor(max_workers=max(1, min(args.workers, len(todo) or 1))) as pool:
        futures = [pool.submit(write_shard, s, str(src), str(dst), args) for s in todo]
        try:
            for future in _as_done(futures):
                url, size = future.result()
                done[url] = size
                bar.update(counts[url])
        except BaseException:
            for future in futures:
                future.cancel()
            raise
    bar.close()
    for split in ("train", "val"):
        listed = [
            {"url": s.url, "nsamples": counts[s.url], "filesize": done[s.url]}
            for s in shards
            if s.split == split
        ]
        split_info = {**info, "formats": info["formats"][split]} if "formats" in info else info
        descriptor = {
            "wids_version": 1,
            "name": split,
            "shardlist": listed,
            "tuneup": {"format": 1, "source": record["source"], **split_info},
        }
        _write_atomically(dst / f"{split}.json", json.dumps(descriptor, indent=1))
    return {
        "shards": len(shards),
        "written": len(todo),
        "kept": len(shards) - len(todo),
        "samples": sum(counts.values()),
    }


def _as_done(futures):
    pending = set(futures)
    while pending:
        finished, pending = wait(pending, return_when=FIRST_EXCEPTION)
        yield from finished


def prepare(dst: Path, record: dict) -> None:
    """Make ``dst`` (or check that it holds this same conversion), and clear unfinished files."""
    plan = dst / PLAN
    if plan.exists():
        earlier = json.loads(plan.read_text())
        if earlier.get("digest") != record["digest"]:
            raise TuneupError(
                f"{dst} holds shards of another conversion (from {earlier.get('source')}, or with "
                "other options, or the source changed since); remove it or choose another DST"
            )
    elif dst.exists() and any(dst.iterdir()):
        raise TuneupError(
            f"{dst} is not empty and was not written by tuneup-shards; choose "
            "an empty or new folder"
        )
    for split in ("train", "val"):
        (dst / split).mkdir(parents=True, exist_ok=True)
        for leftover in (dst / split).glob(".*.tmp-*"):
            leftover.unlink()
    if not plan.exists():
        _write_atomically(plan, json.dumps(record, indent=1))


def _write_atomically(path: Path, text: str) -> None:
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    temporary.write_text(text)
    os.replace(temporary, path)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tuneup-shards",
        description="Convert an image folder (train/ and val/ with one folder per class) or a "
        "text file into WebDataset shards for data=shards data.path=DST.",
    )
    p.add_argument(
        "src", type=Path, help="an image folder (data=imagefolder's layout) or a text file"
    )
    p.add_argument("dst", type=Path, help="the folder to write (new, empty, or an unfinished one)")
    p.add_argument(
        "--shard-size",
        type=parse_size,
        default=parse_size("256MB"),
        help="bytes per shard at most (one sample at least): 256MB (default), 1GB...",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=min(8, len(os.sched_getaffinity(0))),
        help="processes writing shards (default: min(8, usable CPUs))",
    )
    p.add_argument(
        "--resize",
        type=int,
        default=None,
        metavar="PX",
        help="images: re-encode as JPEG with the shorter side at most PX (default: "
        "keep each file's bytes as they are)",
    )
    p.add_argument("--quality", type=int, default=90, help="JPEG quality with --resize (90)")
    p.add_argument("--context", type=int, default=256, help="text: tokens per window (256)")
    p.add_argument(
        "--val-fraction",
        type=float,
        default=0.1,
        help="text: share of the file, from its end, for validation (0.1)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    try:
        missing = [m for m in ("webdataset", "wids") if _absent(m)]
        if missing:
            raise TuneupError(
                f"tuneup-shards writes WebDataset shards, and {' and '.join(missing)} "
                "not installed: pip install 'tuneup[shards]'"
            )
        if not args.src.exists():
            raise TuneupError(f"{args.src} does not exist: give an image folder or a text file")
        if args.workers < 1 or args.context < 1 or not 0 < args.val_fraction < 1:
            raise TuneupError("--workers and --context must be >= 1, --val-fraction in (0, 1)")
        if args.resize is not None and args.resize < 1:
            raise TuneupError(f"--resize {args.resize}: give the shorter side in pixels, >= 1")
        result = convert(args.src, args.dst, args)
    except TuneupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"interrupted: run the same command again to finish {args.dst}", file=sys.stderr)
        return 130
    print(
        f"{args.dst}: {result['samples']} samples in {result['shards']} shards "
        f"({result['written']} written, {result['kept']} kept from before); train with: "
        f"data=shards data.path={args.dst}"
    )
    return 0


def _absent(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is None


if __name__ == "__main__":
    sys.exit(main())
