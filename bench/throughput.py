"""Training throughput of ResNet-50 at 224x224 as optimizations are switched on one by one, each
beside the hand-written loop's figure (its ceiling) measured in the same run.

fp32 -> amp -> amp + channels_last -> amp + channels_last + compile, each a separate
``python run.py`` process (so cuDNN, autocast and compile state never leak between them)
on synthetic images, once per data path (``--data``):

- ``loader``: uint8 images through DataLoader workers and pinned memory, made floats on
  the GPU, the next batch copied on a side stream while the step computes (the defaults:
  ``dataloader=workers``, ``data.preprocess=device``, ``data_path=auto``);
- ``on_device``: ``data.on_device=true``, the images generated and kept on the GPU: the
  model alone, so the gap between the two rows is what the data path costs;
- ``worker`` (not by default): float32 batches from the workers, the path before;
- ``sync`` (not by default): ``loader`` without the prefetcher (``data_path=sync``).

and the hand-written loop of bench/hand_loop.py with the same model, optimizer and
precision (``--hand``: ``gpu``, data already on the GPU; ``uint8-loader``; ``fp32-loader``).
Prints one Markdown table: samples/s, the ratio to the hand loop with data on the GPU,
step time p50/p90, data_wait_fraction, TFLOP/s and MFU (against the GPU's dense bf16
peak, trainer/flops.py) from each run's summary.json.

    python bench/throughput.py                                  # the GPU table (CUDA)
    python bench/throughput.py --configs amp+channels_last --data loader,on_device,sync
    python bench/throughput.py --accelerator cpu --image-size 32 --batch-size 8 \\
        --steps 6 --warmup 2 --width 8 --configs fp32,amp       # a smoke run of the script
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CONFIGS = {
    "fp32": ["precision=fp32"],
    "amp": ["precision=amp"],
    "amp+channels_last": ["precision=amp", "memory_format=channels_last"],
    "amp+channels_last+compile": ["precision=amp", "memory_format=channels_last", "compile=on"],
}
#: tuneup's data paths: the run.py overrides of each.
DATA = {
    "loader": ["dataloader=workers"],
    "on_device": ["data.on_device=true"],
    "worker": ["dataloader=workers", "data.preprocess=worker"],
    "sync": ["dataloader=workers", "data_path=sync"],
}
HAND = ("gpu", "uint8-loader", "fp32-loader")


def overrides(args) -> list[str]:
    """The run.py arguments every configuration shares."""
    batches = 10  # distinct synthetic batches kept in memory (the data repeat every 10 steps)
    return [
        f"model={args.model}",
        f"model.width={args.width}",
        "data=synthetic_images",
        f"data.image_size={args.image_size}",
        f"data.num_classes={args.classes}",
        f"data.batch_size={args.batch_size}",
        f"data.train_samples={batches * args.batch_size}",
        f"data.val_samples={args.batch_size}",
        f"trainer.accelerator={args.accelerator}",
        f"trainer.max_steps={args.steps}",
        "trainer.max_epochs=-1",
        "+trainer.limit_val_batches=0",
        "checkpoint=off",
        "trainer.enable_progress_bar=false",
        f"measure.warmup_steps={args.warmup}",
        *args.extra,
    ]


def run(config: str, data: str, args, out: Path) -> dict:
    run_dir = out / f"{config}-{data}"
    command = [
        sys.executable,
        str(ROOT / "run.py"),
        *overrides(args),
        *CONFIGS[config],
        *DATA[data],
        f"hydra.run.dir={run_dir}",
    ]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"{config} ({data}) failed:\n{result.stderr[-3000:]}")
    return json.loads((run_dir / "summary.json").read_text())


def hand(config: str, data: str, args) -> dict:
    """bench/hand_loop.py with the configuration's precision, layout and compile."""
    flags = ["--precision", "fp32" if config == "fp32" else "amp"]
    flags += ["--channels-last"] * ("channels_last" in config) + ["--compile"] * (
        "compile" in config
    )
    command = [
        sys.executable,
        str(ROOT / "bench" / "hand_loop.py"),
        "--data",
        data,
        "--model",
        args.model,
        "--width",
        str(args.width),
        "--image-size",
        str(args.image_size),
        "--classes",
        str(args.classes),
        "--batch-size",
        str(args.batch_size),
        "--steps",
        str(args.steps),
        "--warmup",
        str(args.warmup),
        "--device",
        "cpu" if args.accelerator == "cpu" else "cuda",
        *flags,
    ]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"hand loop {config} ({data}) failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def tuneup_row(config: str, data: str, s: dict, ceiling: float | None) -> str:
    speed, steps = s["samples_per_s"], s["step_time_ms"]
    ratio = speed / ceiling if speed and ceiling else None
    return (
        f"| {config} | tuneup, {data} | {fmt(speed, ',.0f')} | {fmt(ratio, '.2f')} "
        f"| {fmt(steps['p50'], '.1f')} | {fmt(steps['p90'], '.1f')} "
        f"| {fmt(s['data_wait_fraction'], '.2f')} | {fmt(s['achieved_tflops'], '.1f')} "
        f"| {fmt(s['mfu'], '.1%')} | {s['peak_memory_bytes'] / 2**30:.1f} "
        f"| {fmt(s.get('compile_seconds'), '.0f')} | {s['plugins']['precision'].get('ran_as', '-')} |"
    )


def hand_row(config: str, data: str, h: dict, ceiling: float | None) -> str:
    ratio = h["samples_per_s"] / ceiling if ceiling else None
    return (
        f"| {config} | hand loop, {data} | {h['samples_per_s']:,.0f} | {fmt(ratio, '.2f')} "
        f"| {h['step_ms']:.1f} (mean) | - | - | - | - | - | - | "
        f"{'bf16' if h['precision'] == 'amp' else 'fp32'} |"
    )


def measure(config: str, args, out: Path) -> tuple[list[str], list[dict]]:
    """The table rows of one configuration (the hand loops first, then tuneup's data paths)
    and tuneup's summaries."""
    hands = {data: hand(config, data, args) for data in args.hand}
    ceiling = hands["gpu"]["samples_per_s"] if "gpu" in hands else None
    rows = [hand_row(config, data, h, ceiling) for data, h in hands.items()]
    summaries = {data: run(config, data, args, out) for data in args.data}
    rows += [tuneup_row(config, data, s, ceiling) for data, s in summaries.items()]
    return rows, list(summaries.values())


def _names(value: str, allowed, what: str) -> list[str]:
    names = [v for v in value.split(",") if v]
    unknown = [v for v in names if v not in allowed]
    if unknown:
        raise SystemExit(f"unknown {what} {', '.join(unknown)}: choose from {', '.join(allowed)}")
    return names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="resnet50")
    parser.add_argument(
        "--width", type=int, default=64, help="first-stage channels (64: torchvision)"
    )
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--steps", type=int, default=80, help="optimizer steps per run")
    parser.add_argument(
        "--warmup", type=int, default=20, help="first steps left out (compile, autotune)"
    )
    parser.add_argument("--accelerator", default="gpu")
    parser.add_argument(
        "--configs", default=",".join(CONFIGS), help="comma-separated, of: " + ", ".join(CONFIGS)
    )
    parser.add_argument(
        "--data", default="loader,on_device", help="tuneup's data paths, of: " + ", ".join(DATA)
    )
    parser.add_argument(
        "--hand",
        default="gpu,uint8-loader",
        help="hand loops, of: " + ", ".join(HAND) + " ('' for none)",
    )
    parser.add_argument(
        "--extra", nargs="*", default=[], help="more run.py overrides for every run"
    )
    args = parser.parse_args()
    args.data, args.hand = (
        _names(args.data, DATA, "data path"),
        _names(args.hand, HAND, "hand loop"),
    )
    configs = _names(args.configs, CONFIGS, "configuration")
    rows, summaries = [], []
    with tempfile.TemporaryDirectory() as out:
        for config in configs:
            more, done = measure(config, args, Path(out))
            rows, summaries = rows + more, summaries + done
    first = summaries[0] if summaries else {}
    flops = first.get("flops_per_sample")
    print(
        f"{args.model} at {args.image_size}x{args.image_size}, batch {args.batch_size}, "
        f"{args.steps} steps ({args.warmup} warm-up) on {first.get('device', '-')}, torch "
        f"{first.get('torch', '-')}; {fmt(flops and flops / 1e9, '.2f')} GFLOP per sample "
        f"(forward + backward); MFU against {first.get('peak_tflops') or '-'} TFLOP/s\n"
    )
    print(
        "| configuration | data | samples/s | vs hand loop, data on GPU | step p50 (ms) "
        "| step p90 (ms) | data wait | TFLOP/s | MFU | peak memory (GiB) | compile (s) "
        "| computed in |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
