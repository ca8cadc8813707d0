"""``grad_accum.micro_batch_size=auto`` on a GPU: a batch too large for its memory, trained.

Two ``python run.py`` runs of model=gpt (GPT-2 small: 12 layers, width 768, context 1024,
vocabulary 32k; precision=amp, optimizer=adamw) at ``--batch`` samples a step (default 512,
far above what 80 GB hold at once): ``micro_batch_size=auto``, which halves the micro-batch on
each CUDA out-of-memory error until the step runs, then the size it found fixed. Printed as a
Markdown table: micro-batch size, out-of-memory retries, samples/s, peak memory, last loss.

    python bench/micro_batch.py                    # bench/gpu.sh step micro-batch
    python bench/micro_batch.py --batch 256 --steps 4

Exit code 1 when a run fails, when auto found no smaller size (the batch fit at once, so
nothing was tested: raise ``--batch``), or when the two runs' last losses differ by more than
1% (the same data and the same mathematics; bf16 rounds each micro-batch its own way).
Needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GPT = [
    "model=gpt",
    "model.layers=12",
    "model.width=768",
    "model.heads=12",
    "data=synthetic_tokens",
    "data.context=1024",
    "data.vocab_size=32000",
    "precision=amp",
    "optimizer=adamw",
    "checkpoint=off",
    "trainer.enable_progress_bar=false",
    "measure.console_table=false",
    "trainer.accelerator=gpu",
]


def train(folder: Path, *overrides: str) -> dict:
    """One ``python run.py`` in ``folder``; its summary.json."""
    command = [sys.executable, str(ROOT / "run.py"), f"hydra.run.dir={folder}", *GPT, *overrides]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"failed: {' '.join(command)}\n{done.stderr[-3000:]}")
    return json.loads((folder / "summary.json").read_text())


def row(name: str, summary: dict) -> str:
    def shown(key: str, form: str, scale: float = 1) -> str:
        value = summary.get(key)
        return "-" if value is None else format(value * scale, form)

    cells = [
        name,
        str(summary["micro_batch_size"]),
        str(summary["micro_batch_oom_retries"]),
        shown("samples_per_s", ".1f"),
        shown("peak_memory_bytes", ".1f", 2**-30),
        shown("train_loss", ".4f"),
    ]
    return "| " + " | ".join(cells) + " |"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=512, help="data.batch_size (per step)")
    parser.add_argument("--steps", type=int, default=4, help="optimizer steps a run")
    parser.add_argument("--extra", nargs="*", default=[], help="more run.py overrides (last wins)")
    args = parser.parse_args()
    common = [
        f"data.batch_size={args.batch}",
        f"trainer.max_steps={args.steps}",
        f"data.train_samples={args.batch * args.steps}",
        "data.val_samples=64",
        *args.extra,
    ]
    with tempfile.TemporaryDirectory() as folder:
        auto = train(Path(folder) / "auto", *common, "grad_accum.micro_batch_size=auto")
        found = auto["micro_batch_size"]
        fixed = train(Path(folder) / "fixed", *common, f"grad_accum.micro_batch_size={found}")
    print(
        f"GPT-2 small (12 x 768, context 1024), amp, AdamW, {args.batch} samples a step, "
        f"{args.steps} steps:\n"
    )
    print("| micro_batch_size | found | out-of-memory retries | samples/s | peak GiB | last loss |")
    print("|---|---|---|---|---|---|")
    print(row("auto", auto))
    print(row(f"{found} (fixed)", fixed))
    problems = []
    if found >= args.batch:
        problems.append(f"the batch of {args.batch} fit at once: nothing tested; raise --batch")
    if abs(auto["train_loss"] - fixed["train_loss"]) > 0.01 * abs(fixed["train_loss"]):
        problems.append("the last losses differ by more than 1%")
    for problem in problems:
        print(f"\nFAILED: {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
