"""Data loading: the same training on JPEGs read from disk, loaded in the training process
(``dataloader=off``) or by worker processes (``dataloader=workers``, ``num_workers=auto``).

Writes an image folder of generated JPEGs (photo-sized, smooth colour fields with a tint
per class) into a temporary directory, then runs ``python run.py data=imagefolder ...``
once per configuration, interleaved ``--repeats`` times, and prints the median
samples/s and the summary's data_wait_fraction: the share of the training loop's time
spent waiting for the next batch (decoding, random resized crop, flip, normalise).

    python bench/dataloader.py
    python bench/dataloader.py --model small_resnet --image-size 64 --steps 60
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]

CONFIGS = {
    "off (num_workers=0)": ["dataloader=off"],
    "workers (num_workers=auto)": ["dataloader=workers"],
}


def write_images(root: Path, classes: int, train: int, val: int, size: tuple[int, int]) -> None:
    """``train`` + ``val`` JPEGs per split over ``classes`` folders, ``size`` = (width, height)."""
    rng = np.random.default_rng(0)
    tints = rng.uniform(0, 255, (classes, 3))
    for split, count in (("train", train), ("val", val)):
        for i in range(count):
            label = i % classes
            folder = root / split / f"class{label:02d}"
            folder.mkdir(parents=True, exist_ok=True)
            coarse = rng.uniform(0, 255, (6, 8, 3)) * 0.5 + tints[label] * 0.5
            img = Image.fromarray(coarse.astype(np.uint8)).resize(size, Image.Resampling.BICUBIC)
            noisy = np.asarray(img, dtype=np.float32) + rng.normal(0, 12, (size[1], size[0], 3))
            Image.fromarray(noisy.clip(0, 255).astype(np.uint8)).save(
                folder / f"{i:05d}.jpg", quality=90
            )


def run(name: str, args, data_root: Path, run_dir: Path) -> dict:
    command = [
        sys.executable, str(ROOT / "run.py"), "data=imagefolder", f"data.root={data_root}",
        f"data.image_size={args.image_size}", f"data.batch_size={args.batch_size}",
        f"model={args.model}", "optimizer=adamw", f"trainer.max_steps={args.steps}",
        "trainer.max_epochs=-1",
        "+trainer.limit_val_batches=0", "checkpoint=off", "trainer.enable_progress_bar=false",
        f"measure.warmup_steps={args.warmup}", *CONFIGS[name], *args.extra,
        f"hydra.run.dir={run_dir}",
    ]  # fmt: skip
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"{name} failed:\n{result.stderr[-3000:]}")
    return json.loads((run_dir / "summary.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--image-size", type=int, default=96, help="side of the training crops")
    parser.add_argument("--source-size", default="500x375", help="generated JPEGs, WxH")
    parser.add_argument("--classes", type=int, default=8)
    parser.add_argument("--train-images", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=40, help="optimizer steps per run")
    parser.add_argument("--warmup", type=int, default=5, help="first steps left out (worker start)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--extra", nargs="*", default=[], help="more run.py overrides for every run"
    )
    args = parser.parse_args()
    width, height = (int(v) for v in args.source_size.split("x"))
    results: dict[str, list[dict]] = {name: [] for name in CONFIGS}
    with tempfile.TemporaryDirectory() as tmp:
        data_root = Path(tmp) / "images"
        write_images(data_root, args.classes, args.train_images, args.batch_size, (width, height))
        for repeat in range(args.repeats):
            for i, name in enumerate(CONFIGS):
                run_dir = Path(tmp) / f"run{repeat}-{i}"
                results[name].append(run(name, args, data_root, run_dir))
    first = results[next(iter(CONFIGS))][0]
    print(f"{' '.join([f'model={args.model}', *args.extra])}, {args.train_images} JPEGs of {args.source_size} -> "
          f"{args.image_size}x{args.image_size} crops, batch {args.batch_size}, {args.steps} steps "
          f"({args.warmup} warm-up), median of {args.repeats} runs; {first['device']}\n")  # fmt: skip
    print("| dataloader | workers | samples/s | data_wait_fraction | step p50 (ms) |")
    print("|---|---|---|---|---|")
    for name, runs in results.items():
        workers = runs[0]["plugins"].get("dataloader", {}).get("num_workers", 0)
        speed = statistics.median(r["samples_per_s"] for r in runs)
        wait = statistics.median(r["data_wait_fraction"] for r in runs)
        p50 = statistics.median(r["step_time_ms"]["p50"] for r in runs)
        print(f"| {name} | {workers} | {speed:.0f} | {wait:.2f} | {p50:.0f} |")


if __name__ == "__main__":
    main()
