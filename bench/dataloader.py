"""Data loading from JPEGs: how fast the workers decode, and what that does to training.

Writes an image folder of generated photo-like JPEGs (smooth colour noise over several
octaves, hard-edged shapes, sensor grain; quality 90; ImageNet-sized 500x375 and larger)
into a temporary directory, then measures two things:

1. **Decoding** (no model): the training transform of ``data=imagefolder`` (decode,
   random resized crop to ``--image-size``, flip coin) in a DataLoader with each of
   ``--workers`` worker counts and each decoder (``pillow``, ``simplejpeg`` when
   installed, ``nvjpeg`` on CUDA with torchvision; with and without ``draft``), on each
   ``--sources`` size: images/s in all, and per worker from the data module's own
   decode clock (what the run summary reports as decode_images_per_s_per_worker).
2. **Training** (``python run.py``, ``--repeats`` interleaved runs, median shown):
   synthetic images as the reference, then the JPEG folder loaded in the training process
   (``dataloader=off``) and by workers, with each decoder: samples/s, its ratio to the
   synthetic figure, data_wait_fraction and step time; the summary's data_advice names
   the bottleneck when there is one.

3. **Shards** (``--shards``, this alone): ``--shard-images`` JPEGs of 500x375 as a folder
   and as shards (``tuneup-shards``), each read from a cold page cache (``echo 3 >
   /proc/sys/vm/drop_caches`` when this runs as root; else each file's pages dropped with
   ``posix_fadvise(DONTNEED)``, which leaves the directory and inode caches warm) and a warm
   one, in a shuffled order, with each of ``--shard-workers`` DataLoader workers: the bytes
   alone (every image), and tuneup's decode path (``data=imagefolder`` and ``data=shards``'s
   training transform: decode, random resized crop, flip coin; ``--shard-decode`` images).
   The set-up (the folder listed, or the shards' descriptor read), samples/s per worker, and
   the time from asking for the first batch to having it (the workers start, the shards
   are opened and their tar headers indexed).

    python bench/dataloader.py           # CPU: model=mlp on 96x96 crops; CUDA: ResNet-50, 224, amp
    python bench/dataloader.py --skip-training --workers 1,2 --sources 500x375,1024x768
    python bench/dataloader.py --shards  # 5,120 JPEGs: folder against shards, cold and warm
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFilter

from tuneup.trainer.environment import usable_cpus

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dataloader_shards import shards_table

ROOT = Path(__file__).resolve().parents[1]
BASES = 16  # distinct generated photos per size; the files are shifted, tinted copies


def photo(width: int, height: int, rng) -> np.ndarray:
    """A photo-like ``[height, width, 3]`` uint8 image: detail at every scale, edges, grain."""
    pixels = np.zeros((height, width, 3), np.float32)
    for octave in range(1, 9):  # 1/sqrt(f) noise: coarse colour fields down to fine texture
        cells = 2**octave
        grid = rng.normal(0, 40, (cells * height // width + 2, cells + 2, 3)) + 128
        layer = Image.fromarray(grid.clip(0, 255).astype(np.uint8))
        layer = np.asarray(layer.resize((width, height), Image.Resampling.BICUBIC), np.float32)
        pixels += (layer - 128) / octave**0.5
    picture = Image.fromarray((pixels + rng.uniform(60, 190, 3)).clip(0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(picture)
    for _ in range(rng.integers(6, 14)):  # objects: hard edges cost the JPEG coder
        x, y = rng.uniform(0, width), rng.uniform(0, height)
        w, h = rng.uniform(0.05, 0.4) * width, rng.uniform(0.05, 0.4) * height
        colour = tuple(int(c) for c in rng.uniform(0, 255, 3))
        if rng.random() < 0.5:
            draw.ellipse((x, y, x + w, y + h), fill=colour)
        else:
            corners = rng.integers(3, 7)
            draw.polygon(
                [(x + rng.uniform(-w, w), y + rng.uniform(-h, h)) for _ in range(corners)],
                fill=colour,
            )
    picture = np.asarray(picture.filter(ImageFilter.GaussianBlur(0.8)), np.float32)
    return (picture + rng.normal(0, 8, picture.shape)).clip(0, 255).astype(np.uint8)


def write_images(root: Path, classes: int, train: int, val: int, size: tuple[int, int]) -> None:
    """``train`` + ``val`` JPEGs (quality 90) over ``classes`` folders, ``size`` = (width, height)."""
    rng = np.random.default_rng(0)
    bases = [photo(*size, rng) for _ in range(BASES)]
    for split, count in (("train", train), ("val", val)):
        for i in range(count):
            folder = root / split / f"class{i % classes:02d}"
            folder.mkdir(parents=True, exist_ok=True)
            base = np.roll(bases[i % BASES], rng.integers(0, size[0]), axis=1)
            tint = rng.uniform(0.8, 1.2, 3)
            image = (base * tint).clip(0, 255).astype(np.uint8)
            Image.fromarray(image).save(folder / f"{i:05d}.jpg", quality=90)


# --- 1. decoding -------------------------------------------------------------------------


def decoders(cuda: bool) -> list[str]:
    found = ["pillow"]
    if importlib.util.find_spec("simplejpeg"):
        found.append("simplejpeg")
    if cuda and importlib.util.find_spec("torchvision"):
        found.append("nvjpeg")
    return found


def decode_rate(root: Path, decoder: str, draft: bool, workers: int, args) -> dict:
    """Images/s of the training transform over the folder, with ``workers`` workers."""
    import tuneup
    from tuneup.trainer.components import Plan

    cfg = tuneup.compose(
        [
            "data=imagefolder",
            f"data.root={root}",
            f"data.decoder={decoder}",
            f"data.draft={str(draft).lower()}",
            f"data.image_size={args.image_size}",
            f"data.batch_size={args.decode_batch}",
        ]
    )
    data = Plan(cfg).data
    data.setup()
    loader = torch.utils.data.DataLoader(
        data.train_set,
        batch_size=args.decode_batch,
        shuffle=True,
        num_workers=workers,
        persistent_workers=workers > 0,
        collate_fn=data.loader_options.get("collate_fn"),
    )
    device = torch.device("cuda" if decoder == "nvjpeg" else "cpu")
    wanted = args.decode_images * max(1, workers)
    images, started = 0, None
    while images < wanted:
        for batch in loader:
            if decoder == "nvjpeg":
                data.device_batch(batch, device)
            if started is None:  # the first batch pays for starting the workers
                started, images = time.perf_counter(), 0
                continue
            images += args.decode_batch
            if images >= wanted:
                break
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    per_worker = data.clock.figures().get("decode_images_per_s_per_worker")
    return {"images_per_s": images / seconds, "per_worker": per_worker}


def decoding_table(folders: dict[str, Path], args, cuda: bool) -> list[str]:
    rows = [
        "| source | decoder | draft | workers | images/s | per worker (in-worker time) |",
        "|---|---|---|---|---|---|",
    ]
    for source, root in folders.items():
        for decoder in args.decoders or decoders(cuda):
            for draft in (False, True) if decoder != "nvjpeg" else (False,):
                for workers in args.workers:
                    r = decode_rate(root, decoder, draft, workers, args)
                    rows.append(
                        f"| {source} | {decoder} | {'on' if draft else 'off'} | {workers} "
                        f"| {r['images_per_s']:,.0f} | {fmt(r['per_worker'], ',.0f')} |"
                    )
    return rows


# --- 2. training -------------------------------------------------------------------------


def training_runs(root: Path, cuda: bool, args) -> dict[str, list[str]]:
    """The run.py overrides of each training row."""
    folder = ["data=imagefolder", f"data.root={root}"]
    workers = ["dataloader=workers", f"dataloader.num_workers={args.train_workers}"]
    runs = {
        "synthetic images (uint8)": ["data=synthetic_images", "data.train_samples=2048", *workers]
    }
    if not cuda:
        runs["JPEGs, dataloader=off (num_workers=0)"] = [*folder, "dataloader=off"]
    for decoder in args.decoders or decoders(cuda):
        runs[f"JPEGs, {decoder}"] = [*folder, *workers, f"data.decoder={decoder}"]
    return runs


def train(name: str, overrides: list[str], args, run_dir: Path) -> dict:
    command = [
        sys.executable,
        str(ROOT / "run.py"),
        f"data.image_size={args.image_size}",
        f"data.batch_size={args.batch_size}",
        f"model={args.model}",
        f"trainer.max_steps={args.steps}",
        "trainer.max_epochs=-1",
        "+trainer.limit_val_batches=0",
        "checkpoint=off",
        "trainer.enable_progress_bar=false",
        f"measure.warmup_steps={args.warmup}",
        *overrides,
        *args.extra,
        f"hydra.run.dir={run_dir}",
    ]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"{name} failed:\n{result.stderr[-3000:]}")
    return json.loads((run_dir / "summary.json").read_text())


def training_table(root: Path, cuda: bool, args, tmp: Path) -> list[str]:
    runs = training_runs(root, cuda, args)
    results: dict[str, list[dict]] = {name: [] for name in runs}
    for repeat in range(args.repeats):
        for i, (name, overrides) in enumerate(runs.items()):
            results[name].append(train(name, overrides, args, tmp / f"run{repeat}-{i}"))
    reference = statistics.median(r["samples_per_s"] for r in next(iter(results.values())))
    rows = [
        "| data | workers | samples/s | vs synthetic | data_wait_fraction | step p50 (ms) "
        "| step p90 (ms) | decode/s per worker |",
        "|---|---|---|---|---|---|---|---|",
    ]
    advice = []
    for name, runs_ in results.items():
        path = runs_[0].get("data_path", {})
        speed = statistics.median(r["samples_per_s"] for r in runs_)
        wait = statistics.median(r["data_wait_fraction"] for r in runs_)
        p50 = statistics.median(r["step_time_ms"]["p50"] for r in runs_)
        p90 = statistics.median(r["step_time_ms"]["p90"] for r in runs_)
        rate = path.get("decode_images_per_s_per_worker")
        rows.append(
            f"| {name} | {path.get('num_workers', '-')} | {speed:,.0f} "
            f"| {speed / reference:.2f} | {wait:.2f} | {p50:.0f} | {p90:.0f} "
            f"| {fmt(rate, ',.0f')} |"
        )
        if runs_[0].get("data_advice"):
            advice.append(f"- {name}: {runs_[0]['data_advice']}")
    return rows + (["", *advice] if advice else [])


# --- 3. shards ----------------------------------------------------------------------------


def fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _sizes(text: str) -> list[tuple[int, int]]:
    return [tuple(int(v) for v in size.split("x")) for size in text.split(",")]


def main() -> None:
    cuda = torch.cuda.is_available()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="resnet50" if cuda else "mlp")
    parser.add_argument("--image-size", type=int, default=224 if cuda else 96)
    parser.add_argument("--sources", default="500x375,1024x768", help="JPEG sizes, WxH,...")
    parser.add_argument(
        "--workers",
        default="1,4,8,16" if cuda else "1,2",
        help="worker counts of the decoding table",
    )
    parser.add_argument("--decoders", default="", help="default: every one usable here")
    parser.add_argument("--classes", type=int, default=8)
    parser.add_argument("--train-images", type=int, default=2048 if cuda else 512)
    parser.add_argument("--decode-images", type=int, default=256, help="per worker")
    parser.add_argument("--decode-batch", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=256 if cuda else 32)
    parser.add_argument("--steps", type=int, default=40, help="optimizer steps per run")
    parser.add_argument("--warmup", type=int, default=10, help="first steps left out")
    parser.add_argument(
        "--train-workers",
        default=str(min(16, usable_cpus())) if cuda else "auto",
        help="dataloader.num_workers of the training runs",
    )
    parser.add_argument("--repeats", type=int, default=1 if cuda else 2)
    parser.add_argument("--skip-training", action="store_true")
    parser.add_argument(
        "--shards",
        action="store_true",
        help="only the shards table: a folder against its shards, cold and warm",
    )
    parser.add_argument("--shard-images", type=int, default=5120)
    parser.add_argument(
        "--shard-decode",
        type=int,
        default=2048,
        help="images each decode-path row decodes (a shuffled subset)",
    )
    parser.add_argument("--shard-workers", default="1,2")
    parser.add_argument("--shard-size", default="128MB")
    parser.add_argument(
        "--extra", nargs="*", default=None, help="more run.py overrides for every training run"
    )
    args = parser.parse_args()
    args.workers = [int(w) for w in args.workers.split(",")]
    args.shard_workers = [int(w) for w in args.shard_workers.split(",")]
    args.decoders = [d for d in args.decoders.split(",") if d]
    if args.extra is None:  # what the GPU figures of docs/benchmarks.md use
        args.extra = (
            ["precision=amp", "memory_format=channels_last"] if cuda else ["optimizer=adamw"]
        )
    if args.shards:
        with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
            print("\n".join(shards_table(args, Path(tmp), write_images)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        folders = {}
        for width, height in _sizes(args.sources):
            folders[f"{width}x{height}"] = Path(tmp) / f"jpeg{width}x{height}"
            write_images(
                folders[f"{width}x{height}"],
                args.classes,
                args.train_images,
                args.batch_size,
                (width, height),
            )
        device = torch.cuda.get_device_name() if cuda else "cpu"
        print(
            f"{args.train_images} JPEGs per source, quality 90 -> {args.image_size}x"
            f"{args.image_size} random resized crops; {device}, {torch.get_num_threads()} "
            f"threads, torch {torch.__version__}\n"
        )
        print("\n".join(decoding_table(folders, args, cuda)))
        if not args.skip_training:
            source = next(iter(folders))
            print(
                f"\nTraining: model={args.model} {' '.join(args.extra)}, batch "
                f"{args.batch_size}, {args.steps} steps ({args.warmup} warm-up), JPEGs of "
                f"{source}, median of {args.repeats} run(s)\n"
            )
            print("\n".join(training_table(folders[source], cuda, args, Path(tmp))))


if __name__ == "__main__":
    main()
