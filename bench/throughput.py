"""Training throughput of ResNet-50 at 224x224 as optimizations are switched on one by one.

fp32 -> amp -> amp + channels_last -> amp + channels_last + compile, each a separate
``python run.py`` process (so cuDNN, autocast and compile state never leak between them)
on synthetic images, batches loaded by worker processes into pinned memory. Prints a
Markdown table of samples/s, step time, achieved TFLOP/s and MFU from each run's
summary.json (MFU against the GPU's dense bf16 peak, trainer/flops.py).

    python bench/throughput.py                                  # the GPU table (CUDA)
    python bench/throughput.py --configs fp32,amp --extra cudnn_benchmark=on
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


def overrides(args) -> list[str]:
    """The run.py arguments every configuration shares."""
    batches = 10  # distinct synthetic batches kept in memory (the data repeat every 10 steps)
    return [
        f"model={args.model}", f"model.width={args.width}", "data=synthetic_images",
        f"data.image_size={args.image_size}", f"data.num_classes={args.classes}",
        f"data.batch_size={args.batch_size}", f"data.train_samples={batches * args.batch_size}",
        f"data.val_samples={args.batch_size}", f"trainer.accelerator={args.accelerator}",
        f"trainer.max_steps={args.steps}", "trainer.max_epochs=-1", "+trainer.limit_val_batches=0",
        "checkpoint=off", "trainer.enable_progress_bar=false",
        f"measure.warmup_steps={args.warmup}", "dataloader=workers", *args.extra,
    ]  # fmt: skip


def run(name: str, args, out: Path) -> dict:
    run_dir = out / name
    command = [sys.executable, str(ROOT / "run.py"), *overrides(args), *CONFIGS[name],
               f"hydra.run.dir={run_dir}"]  # fmt: skip
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"{name} failed:\n{result.stderr[-3000:]}")
    return json.loads((run_dir / "summary.json").read_text())


def row(name: str, s: dict) -> str:
    def fmt(value, spec):
        return "-" if value is None else format(value, spec)

    return (
        f"| {name} | {fmt(s['samples_per_s'], ',.0f')} | {fmt(s['step_time_ms']['p50'], '.1f')} "
        f"| {fmt(s['achieved_tflops'], '.1f')} | {fmt(s['mfu'], '.1%')} "
        f"| {s['peak_memory_bytes'] / 2**30:.1f} | {fmt(s.get('compile_seconds'), '.0f')} "
        f"| {s['plugins']['precision'].get('ran_as', '-')} |"
    )


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
        "--extra", nargs="*", default=[], help="more run.py overrides for every run"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as out:
        summaries = {name: run(name, args, Path(out)) for name in args.configs.split(",")}
    first = next(iter(summaries.values()))
    print(f"{args.model} at {args.image_size}x{args.image_size}, batch {args.batch_size}, "
          f"{args.steps} steps ({args.warmup} warm-up) on {first['device']}, torch {first['torch']}; "
          f"{first['flops_per_sample'] / 1e9:.2f} GFLOP per sample (forward + backward); "
          f"MFU against {first['peak_tflops'] or '-'} TFLOP/s\n")  # fmt: skip
    print("| configuration | samples/s | step p50 (ms) | TFLOP/s | MFU | peak memory (GiB) "
          "| compile (s) | computed in |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for name, summary in summaries.items():
        print(row(name, summary))


if __name__ == "__main__":
    main()
