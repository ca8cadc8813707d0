"""Samples to target for each optimizer and schedule: ``data=digits model=mlp`` to val/acc 0.95.

For each candidate (an optimizer and schedule, docs/optimizers.md), one ``tuneup -m`` sweep
over a short learning-rate list and the seeds, every run stopped at the target
(``target.stop=true``, validation every 5 optimizer steps). Samples to target is a count:
exact, whatever the machine's load. Prints a markdown table: per learning rate, each seed's
samples to target (``-``: not reached in 30 epochs) and their mean; the best learning rate
of each candidate in bold.

    python bench/optimizers.py                        # ~18 CPU-minutes (72 runs of ~15 CPU-s)
    python bench/optimizers.py --seeds 0 1 --only muon adamw
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
TASK = [
    "data=digits",
    "model=mlp",
    "model.hidden=[64]",
    "data.image_size=8",
    "data.channels=1",
    "trainer.max_epochs=30",
    "target.metric=val/acc",
    "target.value=0.95",
    "target.stop=true",
    "target.check_every_n_steps=5",
    "checkpoint=off",
    "trainer.enable_progress_bar=false",
    "measure.console_table=false",
]
#: name -> (overrides, learning rates swept)
CANDIDATES = {
    "sgd (default), cosine": (["optimizer=sgd"], [0.05, 0.2, 0.5]),
    "adamw, cosine": (["optimizer=adamw"], [1e-3, 1e-2, 3e-2, 0.1]),
    "nadamw, cosine": (["optimizer=nadamw"], [1e-3, 1e-2, 3e-2, 0.1]),
    "muon, cosine": (["optimizer=muon"], [0.02, 0.05, 0.1, 0.2, 0.5]),
    "schedulefree, constant": (
        ["optimizer=schedulefree", "scheduler=constant"],
        [2.5e-3, 1e-2, 3e-2, 0.1],
    ),
    "adamw, wsd": (["optimizer=adamw", "scheduler=wsd"], [1e-3, 1e-2]),
    "sgd, wsd": (["optimizer=sgd", "scheduler=wsd"], [0.05, 0.2]),
}


def sweep(overrides: list[str], lrs: list[float], seeds: list[int], folder: Path) -> dict:
    """(lr, seed) -> samples to target (None: not reached)."""
    args = [
        "-m",
        *TASK,
        *overrides,
        "optimizer.lr=" + ",".join(map(str, lrs)),
        "seed=" + ",".join(map(str, seeds)),
        f"hydra.sweep.dir={folder}",
    ]
    done = subprocess.run(
        [sys.executable, str(ROOT / "run.py"), *args], capture_output=True, text=True, cwd=ROOT
    )
    if done.returncode:
        raise SystemExit(f"failed: {shlex.join(args)}\n{done.stderr[-2000:]}")
    found = {}
    for summary in folder.glob("*/summary.json"):
        chosen = yaml.safe_load((summary.parent / ".hydra" / "overrides.yaml").read_text())
        pairs = dict(o.split("=", 1) for o in chosen)
        found[float(pairs["optimizer.lr"]), int(pairs["seed"])] = json.loads(
            summary.read_text()
        ).get("samples_to_target")
    return found


def table(results: dict, seeds: list[int]) -> str:
    """Runs missing from ``results`` (``--lrs``, ``--only``) are left out."""
    lines = [
        f"| candidate | lr | samples to target (seeds {', '.join(map(str, seeds))}) | mean |",
        "|---|---|---|---|",
    ]
    for name, (_, lrs) in CANDIDATES.items():
        if name not in results:
            continue
        means = {}
        lrs = [lr for lr in lrs if any((lr, s) in results[name] for s in seeds)]
        for lr in lrs:
            counts = [results[name].get((lr, s)) for s in seeds]
            means[lr] = statistics.mean(counts) if None not in counts else None
        reached = [lr for lr in lrs if means[lr] is not None]
        best = min(reached, key=means.get) if reached else None
        for lr in lrs:
            counts = [results[name].get((lr, s)) for s in seeds]
            mean = "-" if means[lr] is None else f"{means[lr]:,.0f}"
            mean = f"**{mean}**" if lr == best else mean
            shown = ", ".join("-" if c is None else f"{c:,}" for c in counts)
            lines.append(f"| {name} | {lr:g} | {shown} | {mean} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--only", nargs="+", help="candidate names starting with these")
    parser.add_argument(
        "--lrs",
        type=int,
        nargs="+",
        help="only these of each learning rate list (0-based positions), to split the work",
    )
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, (overrides, lrs)) in enumerate(CANDIDATES.items()):
            if args.only and not name.startswith(tuple(args.only)):
                continue
            lrs = [lr for j, lr in enumerate(lrs) if args.lrs is None or j in args.lrs]
            results[name] = sweep(overrides, lrs, args.seeds, Path(tmp) / str(i))
            print(f"done: {name}: {results[name]}", file=sys.stderr, flush=True)
    print(f"`{shlex.join(['tuneup', *TASK])}`, per candidate `-m optimizer.lr=...`\n")
    print(table(results, args.seeds))


if __name__ == "__main__":
    main()
