"""Step time, peak memory and saved activation bytes of each memory lever, off and on.

Levers: ``memory_format=channels_last``, ``grad_accum.steps=4`` (at a quarter of
the batch size, so the effective batch stays the same), ``activation_checkpointing=blocks``,
and all three together, against a baseline with none. Each variant is its own
``python run.py`` process (peak RSS is per process, global state does not leak)
and its figures come from the run's summary.json (plugins/measure/):

- samples/s and step time p50 (one micro-batch: under grad_accum a step is a
  quarter of the baseline's, compare samples/s);
- peak memory: the CUDA caching allocator's peak on GPU, the process's peak RSS
  on CPU (which includes ~0.5 GB of Python, torch and Lightning);
- saved activation bytes: what autograd keeps for backward in one forward.

On CUDA the default ResNet and ResNet-50 (224x224) are measured with
``precision=amp`` (channels_last pays off on tensor cores only); on CPU the
default ResNet in fp32.

A second table measures ``activation_checkpointing`` on a GPT (on CUDA GPT-2
small's shape: 12 layers, 12 heads, width 768, context 1024, vocabulary 32,768,
batch 16, precision=amp; on CPU a 4-layer one): off, selective, every 2nd block
and all blocks, with saved bytes and step time against off, and the issue's
target for selective (>= 40% fewer saved bytes at <= 1.25x the step time).

Model parallelism's memory per process is bench/memory_parallel.py's; start-up's (the model
built, sharded and initialised) bench/memory_startup.py's.

    python bench/memory.py                     # CUDA if present, else CPU; both tables
    python bench/memory.py --device cpu --batch-size 128 --steps 20
    python bench/memory.py --tables checkpointing   # only the GPT table
    python bench/memory.py -- optimizer=adamw  # more run.py overrides for every run
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: Variant name -> run.py overrides; grad_accum's batch size is set in ``overrides``.
VARIANTS = {
    "baseline": [],
    "channels_last": ["memory_format=channels_last"],
    "grad_accum x4": ["grad_accum.steps=4"],
    "activation_checkpointing": ["activation_checkpointing=blocks"],
    "all three": [
        "memory_format=channels_last", "grad_accum.steps=4", "activation_checkpointing=blocks",
    ],
}  # fmt: skip

#: Per device: (model, image size, classes, batch size) for each model measured.
MODELS = {
    "cuda": [("small_resnet", 32, 10, 256), ("resnet50", 224, 1000, 128)],
    "cpu": [("small_resnet", 32, 10, 128)],
}
PRECISION = {"cuda": "amp", "cpu": "fp32"}

#: activation_checkpointing choices measured on a GPT.
CHECKPOINTING = {
    "off": ["activation_checkpointing=off"],
    "selective": ["activation_checkpointing=selective"],
    "every 2nd block": ["activation_checkpointing=blocks", "activation_checkpointing.every_n=2"],
    "all blocks": ["activation_checkpointing=blocks"],
}
#: The GPT of the checkpointing table, per device (CUDA: GPT-2 small's shape, the issue's).
GPT = {
    "cuda": dict(layers=12, heads=12, width=768, context=1024, vocab_size=32768, batch=16),
    "cpu": dict(layers=4, heads=4, width=128, context=128, vocab_size=2048, batch=8),
}
#: How the bench starts ``python run.py``.
PYTHON = [sys.executable]
#: The issue's target for selective checkpointing against off.
SELECTIVE_TARGET = {"saved": 0.6, "step_time": 1.25}
#: Writing checkpoints is not what is measured here.
NO_CHECKPOINTS = (
    ["checkpoint=off"]
    if (ROOT / "conf" / "checkpoint" / "off.yaml").is_file()
    else ["++trainer.enable_checkpointing=false"]
)


def overrides(args, model, variant: str, run_dir: Path) -> list[str]:
    name, image_size, classes, batch = model
    accumulate = "grad_accum.steps=4" in VARIANTS[variant]
    micro_batch = batch // 4 if accumulate else batch
    return [
        f"model={name}",
        f"precision={PRECISION[args.device]}",
        f"trainer.accelerator={'gpu' if args.device == 'cuda' else 'cpu'}",
        f"data.image_size={image_size}",
        f"data.num_classes={classes}",
        f"data.batch_size={micro_batch}",
        f"data.train_samples={batch * args.steps}",
        f"data.val_samples={micro_batch}",
        f"trainer.max_steps={args.steps}",
        "trainer.max_epochs=1",
        f"measure.warmup_steps={args.warmup * (4 if accumulate else 1)}",
        "trainer.enable_progress_bar=false",
        "++trainer.limit_val_batches=0",
        *NO_CHECKPOINTS,
        f"hydra.run.dir={run_dir}",
        *VARIANTS[variant],
        *args.extra,
    ]


def gpt_overrides(args, variant: str, run_dir: Path) -> list[str]:
    shape = GPT[args.device]
    return [
        "model=gpt",
        "data=synthetic_tokens",
        *(f"model.{key}={shape[key]}" for key in ("layers", "heads", "width")),
        f"data.context={shape['context']}",
        f"data.vocab_size={shape['vocab_size']}",
        f"data.batch_size={shape['batch']}",
        f"data.train_samples={shape['batch'] * args.steps}",
        f"data.val_samples={shape['batch']}",
        f"precision={PRECISION[args.device]}",
        f"trainer.accelerator={'gpu' if args.device == 'cuda' else 'cpu'}",
        f"trainer.max_steps={args.steps}",
        "trainer.max_epochs=1",
        f"measure.warmup_steps={args.warmup}",
        "trainer.enable_progress_bar=false",
        "++trainer.limit_val_batches=0",
        *NO_CHECKPOINTS,
        f"hydra.run.dir={run_dir}",
        *CHECKPOINTING[variant],
        *args.extra,
    ]


def run_one(args, model, variant: str, workdir: Path, gpt: bool = False) -> dict:
    run_dir = workdir / f"{model[0]}-{variant.replace(' ', '_')}"
    arguments = (
        gpt_overrides(args, variant, run_dir) if gpt else overrides(args, model, variant, run_dir)
    )
    command = [*PYTHON, str(ROOT / "run.py"), *arguments]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    row = {"model": model[0], "variant": variant, "batch": model[3]}
    if done.returncode != 0:
        return {**row, "error": done.stderr.strip().splitlines()[-1:] or [str(done.returncode)]}
    summary = json.loads((run_dir / "summary.json").read_text())
    keys = ("samples_per_s", "peak_memory_bytes", "saved_activation_bytes", "device")
    return {**row, **{k: summary[k] for k in keys}, "step_ms": summary["step_time_ms"]["p50"]}


def table(rows: list[dict]) -> str:
    lines = [
        "| model | variant | samples/s | step p50 (ms) | peak memory | saved activations | vs baseline |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    base: dict[str, dict] = {}
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['variant']} | failed: {r['error'][0]} | | | | |")
            continue
        b = base.setdefault(r["model"], r)
        saved = r["saved_activation_bytes"] / b["saved_activation_bytes"] - 1
        speed = r["samples_per_s"] / b["samples_per_s"] - 1
        lines.append(
            f"| {r['model']} | {r['variant']} | {r['samples_per_s']:.0f} | {r['step_ms']:.1f} | "
            f"{r['peak_memory_bytes'] / 2**20:,.0f} MiB | "
            f"{r['saved_activation_bytes'] / 2**20:,.1f} MiB | "
            f"speed {speed:+.0%}, saved {saved:+.0%} |"
        )
    return "\n".join(lines)


def checkpointing_table(rows: list[dict]) -> str:
    """Saved bytes and step time of each activation_checkpointing choice against off."""
    lines = [
        "| activation_checkpointing | samples/s | step p50 (ms) | step time vs off | "
        "peak memory | saved activations | saved vs off |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    off = next((r for r in rows if r["variant"] == "off" and "error" not in r), None)
    for r in rows:
        if "error" in r or off is None:
            lines.append(
                f"| {r['variant']} | failed: {r.get('error', ['off failed'])[0]} | | | | | |"
            )
            continue
        lines.append(
            f"| {r['variant']} | {r['samples_per_s']:.1f} | {r['step_ms']:.1f} | "
            f"{r['step_ms'] / off['step_ms']:.2f}x | {size(r['peak_memory_bytes'])} | "
            f"{size(r['saved_activation_bytes'])} | "
            f"{r['saved_activation_bytes'] / off['saved_activation_bytes'] - 1:+.0%} |"
        )
    return "\n".join(lines)


def size(n_bytes: float) -> str:
    return f"{n_bytes / 2**30:.2f} GiB" if n_bytes >= 2**30 else f"{n_bytes / 2**20:,.1f} MiB"


def selective_verdict(rows: list[dict]) -> str:
    """The issue's target for selective against off: fewer saved bytes at a bounded step time."""
    found = {r["variant"]: r for r in rows if "error" not in r}
    if "off" not in found or "selective" not in found:
        return "selective target: not measured (a run failed)"
    saved = found["selective"]["saved_activation_bytes"] / found["off"]["saved_activation_bytes"]
    slower = found["selective"]["step_ms"] / found["off"]["step_ms"]
    passed = saved <= SELECTIVE_TARGET["saved"] and slower <= SELECTIVE_TARGET["step_time"]
    return (
        f"selective target (saved <= {SELECTIVE_TARGET['saved']:.0%} of off at <= "
        f"{SELECTIVE_TARGET['step_time']}x its step time): saved {saved:.0%}, step time "
        f"{slower:.2f}x: {'PASS' if passed else 'FAIL'}"
    )


def parse(argv=None) -> argparse.Namespace:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu"
    )
    parser.add_argument("--batch-size", type=int, help="the baseline's batch (default per model)")
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps per run")
    parser.add_argument("--warmup", type=int, default=3, help="optimizer steps left out of speed")
    parser.add_argument("--json", type=Path, help="also write the rows to this file")
    parser.add_argument(
        "--tables",
        type=lambda s: s.split(","),
        default=["levers", "checkpointing"],
        help="levers (the ResNet levers), checkpointing (the GPT): both by default",
    )
    parser.add_argument("extra", nargs="*", help="more run.py overrides (after --)")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("error: --device cuda but no CUDA device is visible; use --device cpu")
    return args


def main(argv=None) -> None:
    args = parse(argv)
    available = {p.stem for p in (ROOT / "conf" / "model").glob("*.yaml")}
    models = [m for m in MODELS[args.device] if m[0] in available]
    if args.batch_size:
        models = [(*m[:3], args.batch_size) for m in models]
    rows, gpt_rows = [], []
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as workdir:
        for model in models if "levers" in args.tables else []:
            for variant in VARIANTS:
                rows.append(run_one(args, model, variant, Path(workdir)))
                print(f"{model[0]} {variant}: done", file=sys.stderr, flush=True)
        gpt = ("gpt", GPT[args.device]["context"], None, GPT[args.device]["batch"])
        for variant in CHECKPOINTING if "checkpointing" in args.tables else []:
            gpt_rows.append(run_one(args, gpt, variant, Path(workdir), gpt=True))
            print(f"gpt {variant}: done", file=sys.stderr, flush=True)
    if rows or gpt_rows:
        device = next((r["device"] for r in rows + gpt_rows if "device" in r), args.device)
        print(f"device: {device}; precision={PRECISION[args.device]}; {args.steps} optimizer steps")
    if rows:
        print(f"\n{table(rows)}")
    if gpt_rows:
        shape = ", ".join(f"{k} {v}" for k, v in GPT[args.device].items())
        print(f"\nactivation_checkpointing on model=gpt ({shape}):\n")
        print(checkpointing_table(gpt_rows))
        print(f"\n{selective_verdict(gpt_rows)}")
    every = rows + gpt_rows
    if args.json:
        args.json.write_text(json.dumps(every, indent=2) + "\n")
    if any("error" in r for r in every):
        sys.exit(1)  # bench/gpu.sh counts a failed run as a failed benchmark


if __name__ == "__main__":
    main()
