"""What each process holds and sends under model parallelism (``strategy=fsdp``:
FSDP2, tensor parallelism, both; docs/distributed.md), on CPU processes (gloo, one process per
layout's rank): a GPT whose parameters dominate (6 layers of width 768) trained with AdamW in
one process, DDP x2, FSDP x2 (also with precision=bf16), FSDP x4, tensor parallelism x2 and
FSDP x2 over TP x2. Its figures are the summary's ``per_rank`` (plugins/strategy/memory.py):
parameter, gradient and optimizer-state bytes each rank holds after the first optimizer step,
its peak RSS (which includes ~0.5 GB of Python, torch and Lightning), and the bytes that step
all-gathered (the gathered whole), reduce-scattered (the whole that is reduced) and
all-reduced. glibc keeps freed memory that FSDP's transient buffers leave behind, which raises
peak RSS; ``MALLOC_MMAP_THRESHOLD_=65536`` in the environment returns large blocks at once
(docs/benchmarks.md has both). ``--smoke`` runs it at a tiny GPT (tests/test_bench.py).
The memory of start-up (the model built, sharded and initialised) is bench/memory_startup.py's.

    python bench/memory_parallel.py --steps 3
    python bench/memory_parallel.py --smoke --layouts "FSDP x2"
    python bench/memory_parallel.py -- precision=bf16   # more run.py overrides for every run
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: Process layouts of the model-parallel table: name -> (processes, run.py overrides).
LAYOUTS = {
    "1 process": (1, ["strategy=auto"]),
    "DDP x2": (2, ["strategy=ddp"]),
    "FSDP x2": (2, ["strategy=fsdp"]),
    "FSDP x2 bf16": (2, ["strategy=fsdp", "precision=bf16"]),
    "FSDP x4": (4, ["strategy=fsdp"]),
    "TP x2": (2, ["strategy=fsdp", "strategy.tensor_parallel_size=2"]),
    "FSDP x2 over TP x2": (4, ["strategy=fsdp", "strategy.tensor_parallel_size=2"]),
}
#: The GPT of the model-parallel table: parameters (42M, 6 x 12 x 768^2 in the blocks) dominate
#: the activations of a small batch and context, so that a step takes seconds on a CPU core;
#: ``smoke``: the tests' tiny one. ``batch`` is per data-parallel rank.
PARALLEL_GPT = {
    "full": dict(layers=6, heads=12, width=768, context=32, vocab_size=2048, batch=2),
    "smoke": dict(layers=2, heads=4, width=16, context=8, vocab_size=64, batch=8),
}
#: Per-rank figures of the model-parallel table, as summary.json's ``per_rank`` names them.
HELD = ("parameter_bytes", "gradient_bytes", "optimizer_state_bytes")
SENT = ("all_gather_bytes_per_step", "reduce_scatter_bytes_per_step", "all_reduce_bytes_per_step")
#: How the bench starts ``python run.py`` (tests/test_bench.py starts it warm).
PYTHON = [sys.executable]
#: Writing checkpoints is not what is measured here.
NO_CHECKPOINTS = (
    ["checkpoint=off"]
    if (ROOT / "conf" / "checkpoint" / "off.yaml").is_file()
    else ["++trainer.enable_checkpointing=false"]
)


def parallel_overrides(args, layout: str, run_dir: Path) -> list[str]:
    """One layout's run: the GPT with AdamW on CPU processes, checkpoints and validation off."""
    shape = PARALLEL_GPT["smoke" if args.smoke else "full"]
    processes, strategy = LAYOUTS[layout]
    return [
        "model=gpt",
        "data=synthetic_tokens",
        "optimizer=adamw",
        *(f"model.{key}={shape[key]}" for key in ("layers", "heads", "width")),
        f"data.context={shape['context']}",
        f"data.vocab_size={shape['vocab_size']}",
        f"data.batch_size={shape['batch']}",
        f"data.train_samples={shape['batch'] * processes * args.steps}",  # enough for any split
        f"data.val_samples={shape['batch']}",
        "trainer.accelerator=cpu",
        f"trainer.devices={processes}",
        f"trainer.max_steps={args.steps}",
        "trainer.max_epochs=1",
        f"measure.warmup_steps={min(args.warmup, args.steps - 1)}",
        "trainer.enable_progress_bar=false",
        "++trainer.limit_val_batches=0",
        *NO_CHECKPOINTS,
        f"hydra.run.dir={run_dir}",
        *strategy,
        *args.extra,
    ]


def run_parallel(args, layout: str, workdir: Path) -> dict:
    """One layout's per-rank figures (summary.json's ``per_rank``), or the run's error."""
    run_dir = workdir / f"parallel-{layout.replace(' ', '_')}"
    command = [*PYTHON, str(ROOT / "run.py"), *parallel_overrides(args, layout, run_dir)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    row = {"layout": layout, "processes": LAYOUTS[layout][0]}
    if done.returncode != 0:
        return {**row, "error": done.stderr.strip().splitlines()[-1:] or [str(done.returncode)]}
    summary = json.loads((run_dir / "summary.json").read_text())
    return {**row, "per_rank": summary["per_rank"], "device": summary["device"]}


def amount(n_bytes: float) -> str:
    """MiB, or KiB below a tenth of one (the smoke run's figures)."""
    if n_bytes == 0:
        return "0"
    if n_bytes < 2**20 / 10:
        return f"{n_bytes / 2**10:,.1f} KiB"
    return f"{n_bytes / 2**20:,.1f} MiB"


def rank_zero(per_rank: list[dict], key: str) -> str:
    """Rank 0's figure, and the other ranks' range where they differ from it (a figure missing:
    none counted, as one process's collectives)."""
    values = [r.get(key, 0) for r in per_rank]
    shown = amount(values[0])
    if len(set(values)) > 1:
        shown += f" (ranks {amount(min(values))}-{amount(max(values))})"
    return shown


def parallel_table(rows: list[dict]) -> str:
    """Per rank: bytes held, held against one process, peak RSS of every rank, bytes sent."""
    lines = [
        "| layout | processes | parameters | gradients | optimizer state | held vs 1 process | "
        "peak RSS per rank (MiB) | all-gathered / step | reduce-scattered / step | "
        "all-reduced / step |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    one = next((r for r in rows if r["processes"] == 1 and "error" not in r), None)
    for r in rows:
        if "error" in r:
            lines.append(
                f"| {r['layout']} | {r['processes']} | failed: {r['error'][0]} |" + " |" * 7
            )
            continue
        ranks = r["per_rank"]
        held = sum(ranks[0][k] for k in HELD)
        versus = f"{held / sum(one['per_rank'][0][k] for k in HELD):.2f}x" if one else "-"
        peaks = " / ".join(f"{p['peak_memory_bytes'] / 2**20:,.0f}" for p in ranks)
        lines.append(
            f"| {r['layout']} | {r['processes']} | "
            + " | ".join(rank_zero(ranks, k) for k in HELD)
            + f" | {versus} | {peaks} | "
            + " | ".join(rank_zero(ranks, k) for k in SENT)
            + " |"
        )
    return "\n".join(lines)


def parse(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps per run")
    parser.add_argument("--warmup", type=int, default=3, help="optimizer steps left out of speed")
    parser.add_argument("--json", type=Path, help="also write the rows to this file")
    parser.add_argument(
        "--layouts",
        type=lambda s: s.split(","),
        default=list(LAYOUTS),
        help=f"the table's rows, of: {', '.join(LAYOUTS)}",
    )
    parser.add_argument("--smoke", action="store_true", help="a tiny GPT (tests/test_bench.py)")
    parser.add_argument("extra", nargs="*", help="more run.py overrides (after --)")
    args = parser.parse_args(argv)
    if unknown := set(args.layouts) - set(LAYOUTS):
        parser.error(f"unknown layouts {sorted(unknown)}; choose from {list(LAYOUTS)}")
    if args.smoke:
        args.steps = min(args.steps, 2)  # what is checked is that every figure comes out
    return args


def main(argv=None) -> None:
    args = parse(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-memory-parallel-") as workdir:
        for layout in args.layouts:
            rows.append(run_parallel(args, layout, Path(workdir)))
            print(f"parallel {layout}: done", file=sys.stderr, flush=True)
    shape = ", ".join(
        f"{k} {v}" for k, v in PARALLEL_GPT["smoke" if args.smoke else "full"].items()
    )
    print(
        f"model parallelism on CPU, model=gpt ({shape}), optimizer=adamw, fp32 unless "
        f"named, {args.steps} optimizer steps; rank 0's figures after the first step:\n"
    )
    print(parallel_table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    if any("error" in r for r in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
