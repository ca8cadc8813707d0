"""Step time, peak memory and saved activation bytes of each memory lever, off and on.

Levers: ``memory_format=channels_last``, ``grad_accum.steps=4`` (at a quarter of
the batch size, so the effective batch stays the same), ``activation_checkpointing=blocks``,
and all three together, against a baseline with none. Each variant is its own
``python run.py`` process (peak RSS is per process, global state does not leak)
and its figures come from the run's summary.json (plugins/measure.py):

- samples/s and step time p50 (one micro-batch: under grad_accum a step is a
  quarter of the baseline's, compare samples/s);
- peak memory: the CUDA caching allocator's peak on GPU, the process's peak RSS
  on CPU (which includes ~0.5 GB of Python, torch and Lightning);
- saved activation bytes: what autograd keeps for backward in one forward.

On CUDA the default ResNet and ResNet-50 (224x224) are measured with
``precision=amp`` (channels_last pays off on tensor cores only); on CPU the
default ResNet in fp32.

    python bench/memory.py                     # CUDA if present, else CPU
    python bench/memory.py --device cpu --batch-size 128 --steps 20
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


def run_one(args, model, variant: str, workdir: Path) -> dict:
    run_dir = workdir / f"{model[0]}-{variant.replace(' ', '_')}"
    command = [sys.executable, str(ROOT / "run.py"), *overrides(args, model, variant, run_dir)]
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


def parse(argv=None) -> argparse.Namespace:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"),
                        default="cuda" if torch.cuda.is_available() else "cpu")  # fmt: skip
    parser.add_argument("--batch-size", type=int, help="the baseline's batch (default per model)")
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps per run")
    parser.add_argument("--warmup", type=int, default=3, help="optimizer steps left out of speed")
    parser.add_argument("--json", type=Path, help="also write the rows to this file")
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
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as workdir:
        for model in models:
            for variant in VARIANTS:
                rows.append(run_one(args, model, variant, Path(workdir)))
                print(f"{model[0]} {variant}: done", file=sys.stderr, flush=True)
    device = next((r["device"] for r in rows if "device" in r), args.device)
    print(f"device: {device}; precision={PRECISION[args.device]}; {args.steps} optimizer steps\n")
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
