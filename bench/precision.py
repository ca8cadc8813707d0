"""Speed and peak memory of every ``precision=`` choice, each run as ``python run.py`` would.

Each choice trains the same model on the same synthetic data in its own process
(so peak memory and global flags do not leak between runs); samples/s, peak
memory and the data-wait share come from the run's summary.json (plugins/measure/:
steady state after ``--warmup`` steps, CUDA allocator peak on GPU, process peak
RSS on CPU). The speed-up is over the fp32 run. The data are at most
``DISTINCT_BATCHES`` batches, trained over again for ``--steps`` optimizer steps: generating
a batch per step cost more than training on it (50 steps of ResNet-50 at batch 256 generated
12,800 224x224 images, 7.7 GB, three times over, in every one of the seven runs). Exit code 1
if any choice failed or ran longer than ``--timeout``.

    python bench/precision.py                    # CUDA: ResNet-50, 224x224, batch 256
    python bench/precision.py --steps 100 --warmup 20    # longer runs, the same data
    python bench/precision.py --device cpu --repeats 3   # CPU: small_resnet, 32x32, batch 32
    python bench/precision.py --choices fp32,amp -- memory_format=channels_last
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHOICES = ("fp32", "tf32", "fp16", "bf16", "amp", "fp16-true", "bf16-true")

#: Synthetic batches held in memory; runs longer than this many steps train on them again.
DISTINCT_BATCHES = 10

#: Per device: model, data shape, batch size, optimizer steps, warm-up steps left out.
DEFAULTS = {
    "cuda": {
        "model": "resnet50",
        "image_size": 224,
        "num_classes": 1000,
        "batch_size": 256,
        "steps": 30,
        "warmup": 10,
    },
    "cpu": {
        "model": "small_resnet",
        "image_size": 32,
        "num_classes": 10,
        "batch_size": 32,
        "steps": 12,
        "warmup": 3,
    },
}


def overrides(args, choice: str, run_dir: Path) -> list[str]:
    """The run.py arguments of one benchmark run."""
    cuda = args.device == "cuda"
    return [
        f"precision={choice}",
        f"model={args.model}",
        f"trainer.accelerator={'gpu' if cuda else 'cpu'}",
        f"data.image_size={args.image_size}",
        f"data.batch_size={args.batch_size}",
        f"data.train_samples={args.batch_size * min(args.steps, DISTINCT_BATCHES)}",
        f"data.val_samples={args.batch_size}",
        f"data.num_classes={args.num_classes}",
        f"trainer.max_steps={args.steps}",
        "trainer.max_epochs=-1",
        f"measure.warmup_steps={args.warmup}",
        "trainer.enable_progress_bar=false",
        "++trainer.limit_val_batches=0",
        "checkpoint=off",
        # On CUDA: cuDNN picks its fastest kernels, and batches are collated in worker
        # processes and copied from pinned memory, so loading overlaps the GPU's work.
        *(["cudnn_benchmark=on", "dataloader=workers"] if cuda else []),
        f"hydra.run.dir={run_dir}",
        *args.extra,
    ]


def run_one(args, choice: str, run_dir: Path) -> dict:
    """One ``python run.py`` run; its figures from summary.json, or the error it ended with."""
    command = [sys.executable, str(ROOT / "run.py"), *overrides(args, choice, run_dir)]
    env = {**os.environ, **({"OMP_NUM_THREADS": str(args.threads)} if args.threads else {})}
    try:
        done = subprocess.run(
            command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=args.timeout
        )
    except subprocess.TimeoutExpired:
        return {"choice": choice, "error": f"did not finish in --timeout {args.timeout} s"}
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-5:])
        return {"choice": choice, "error": tail or f"exit code {done.returncode}"}
    summary = json.loads((run_dir / "summary.json").read_text())
    return {
        "choice": choice,
        "ran_as": summary["precision"]["ran_as"],
        "samples_per_s": summary["samples_per_s"],
        "peak_memory_bytes": summary["peak_memory_bytes"],
        "data_wait_fraction": summary["data_wait_fraction"],
        "note": summary["precision"]["note"],
        "device": summary["device"],
    }


def merge(runs: list[dict]) -> dict:
    """The repeats of one choice: median speed with its range, the largest peak memory."""
    good = [r for r in runs if "error" not in r]
    if not good:
        return runs[-1]
    speeds = [r["samples_per_s"] for r in good]
    return {
        **good[0],
        "samples_per_s": statistics.median(speeds),
        "samples_per_s_range": (min(speeds), max(speeds)),
        "repeats": len(good),
        "peak_memory_bytes": max(r["peak_memory_bytes"] for r in good),
        "data_wait_fraction": _median([r["data_wait_fraction"] for r in good]),
    }


def table(rows: list[dict]) -> str:
    fp32 = [r["samples_per_s"] for r in rows if r["choice"] == "fp32" and "error" not in r]
    lines = [
        "| precision | ran as | samples/s (median) | min-max | speed-up vs fp32 | peak memory "
        "| data wait |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['choice']} | failed: {r['error'].splitlines()[-1]} | | | | | |")
            continue
        low, high = r["samples_per_s_range"]
        speedup = f"{r['samples_per_s'] / fp32[0]:.2f}x" if fp32 else "-"
        lines.append(
            f"| {r['choice']} | {r['ran_as']} | {r['samples_per_s']:.1f} | {low:.1f}-{high:.1f} "
            f"| {speedup} | {r['peak_memory_bytes'] / 2**20:,.0f} MiB "
            f"| {_percent(r['data_wait_fraction'])} |"
        )
    notes = sorted({f"{r['choice']}: {r['note']}" for r in rows if r.get("note")})
    return "\n".join(lines + ([""] + [f"- {n}" for n in notes] if notes else []))


def _median(values: list) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def check_setup(args) -> None:
    """Fail early and clearly: no CUDA for a CUDA run, or a model config that does not exist."""
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            sys.exit("error: --device cuda but no CUDA device is visible; use --device cpu")
    models = sorted(p.stem for p in (ROOT / "conf" / "model").glob("*.yaml"))
    if args.model not in models:
        sys.exit(
            f"error: --model {args.model}: no conf/model/{args.model}.yaml; "
            f"available models: {', '.join(models)}"
        )


def parse(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--model", help="a conf/model choice (cuda: resnet50, cpu: small_resnet)")
    parser.add_argument("--image-size", type=int)
    parser.add_argument("--num-classes", type=int)
    parser.add_argument("--batch-size", type=int)
    parser.add_argument("--steps", type=int, help="optimizer steps per run")
    parser.add_argument("--warmup", type=int, help="steps left out of the speed figures")
    parser.add_argument("--choices", default=",".join(CHOICES))
    parser.add_argument("--repeats", type=int, default=1, help="rounds over all choices")
    parser.add_argument(
        "--threads", type=int, help="CPU threads per run (OMP_NUM_THREADS); default: torch's"
    )
    parser.add_argument("--timeout", type=float, default=600, help="seconds per run at most")
    parser.add_argument("--json", type=Path, help="also write the rows to this file")
    parser.add_argument("extra", nargs="*", help="more run.py overrides (after --)")
    args = parser.parse_args(argv)
    for key, value in DEFAULTS[args.device].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def main(argv=None) -> None:
    args = parse(argv)
    check_setup(args)
    choices = args.choices.split(",")
    runs: dict[str, list[dict]] = {c: [] for c in choices}
    with tempfile.TemporaryDirectory(prefix="bench-precision-") as workdir:
        for repeat in range(args.repeats):  # round-robin, so a slow spell hits every choice
            for choice in choices:
                runs[choice].append(run_one(args, choice, Path(workdir) / f"{choice}-{repeat}"))
                print(f"{choice}: {runs[choice][-1]}", file=sys.stderr, flush=True)
    rows = [merge(runs[c]) for c in choices]
    device = next((r["device"] for r in rows if "device" in r), args.device)
    print(
        f"device: {device}; model={args.model}, {args.image_size}x{args.image_size}, batch "
        f"{args.batch_size}, {args.steps} steps ({args.warmup} warm-up), {args.repeats} repeat(s)\n"
    )
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(runs, indent=2) + "\n")
    if any("error" in r for rs in runs.values() for r in rs):
        sys.exit(1)


if __name__ == "__main__":
    main()
