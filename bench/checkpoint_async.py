"""Training time lost per checkpoint save, ``checkpoint.async=false`` vs ``true``: a single file
(one process) and a sharded checkpoint (``strategy=fsdp``, 2 processes, gloo), on CPU.

    python bench/checkpoint_async.py                       # gpt 8 x 1024 (101M params), AdamW
    python bench/checkpoint_async.py --layers 2 --steps 8  # a quick look

Each row is ``python run.py`` trained for ``--steps`` optimizer steps twice: saving every
``--every`` steps, and saving only at the end; both end with the same final save (which
training always waits for), so the differences divided by the saves in between are what one
save in the middle of training costs: the time training stood still in it (the summary's
``checkpoints.save_seconds``: the copy of the state and any wait for a save in flight), the
background writer's time, and the training time lost in all (``fit_seconds``: also the cores
the writer takes from the training steps; on a shared machine this wall-clock difference is
mostly noise). A checkpoint holds the weights and AdamW's two moments: 3 x 4 bytes a
parameter. ``keep_last=1``: one checkpoint on disk at a time (two while one is written).
Printed as the Markdown table of docs/benchmarks.md ("Asynchronous checkpoint saves").
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: name -> overrides: a single file written by one process; a sharded directory by 2 (gloo).
LAYOUTS = {"single": [], "sharded": ["strategy=fsdp", "trainer.devices=2"]}


def parse(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--every", type=int, default=4, help="save every this many steps")
    parser.add_argument("--layouts", default=",".join(LAYOUTS), help="comma-separated")
    return parser.parse_args(argv)


def overrides(args, extra: list[str]) -> list[str]:
    batch = 2
    return [
        "model=gpt",
        f"model.layers={args.layers}",
        f"model.width={args.width}",
        "model.heads=8",
        "data=synthetic_tokens",
        "data.context=16",
        f"data.batch_size={batch}",
        f"data.train_samples={batch * args.steps * 2}",
        "data.val_samples=2",
        f"trainer.max_steps={args.steps}",
        "trainer.max_epochs=-1",
        "trainer.enable_progress_bar=false",
        "optimizer=adamw",
        "scheduler=constant",
        "checkpoint.every_n_minutes=null",
        "checkpoint.every_n_epochs=0",
        "checkpoint.keep_last=1",
        *extra,
    ]


def run_one(args, extra: list[str]) -> dict:
    """``python run.py`` with these overrides in a fresh directory; its summary."""
    folder = Path(tempfile.mkdtemp(prefix="bench-checkpoint-"))
    try:
        command = [
            sys.executable,
            str(ROOT / "run.py"),
            f"hydra.run.dir={folder}",
            *overrides(args, extra),
        ]
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
        return json.loads((folder / "summary.json").read_text())
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def measure(args, layout: str, asynchronous: bool) -> dict:
    mode = [f"checkpoint.async={str(asynchronous).lower()}", *LAYOUTS[layout]]
    saving = run_one(args, [*mode, f"checkpoint.every_n_steps={args.every}"])
    final = run_one(args, [*mode, "checkpoint.every_n_steps=null"])
    ran, ended = saving["checkpoints"], final["checkpoints"]
    between = ran["written"] - ended["written"]
    return {
        "layout": layout,
        "async": asynchronous,
        "saves": between,
        "lost_s": (saving["fit_seconds"] - final["fit_seconds"]) / between,
        "blocked_s": (ran["save_seconds"] - ended["save_seconds"]) / between,
        "background_s": (ran.get("background_seconds", 0.0) - ended.get("background_seconds", 0.0))
        / between,
        "final_s": ended["save_seconds"],
        "step_s": final["fit_seconds"] / args.steps,
    }


HEADER = (
    "| checkpoint | checkpoint.async | training stood still per save (s) | background "
    "write per save (s) | training time lost per save (s, wall) | the final save (s) | a "
    "step (s) |\n|---|---|---:|---:|---:|---:|---:|"
)


def row(r: dict) -> str:
    return (
        f"| {r['layout']} | {str(r['async']).lower()} | {r['blocked_s']:.2f} | "
        f"{r['background_s']:.2f} | {r['lost_s']:.2f} | {r['final_s']:.2f} | "
        f"{r['step_s']:.2f} |"
    )


def main(argv=None) -> None:
    args = parse(argv)
    import torch

    import tuneup
    from tuneup.trainer.components import Plan

    model = Plan(tuneup.compose(overrides(args, []))).build_model()
    params = sum(p.numel() for p in model.parameters())
    print(
        f"gpt {args.layers} x {args.width}: {params / 1e6:.0f}M parameters, a checkpoint of "
        f"~{3 * params * 4 / 2**30:.2f} GiB; {args.steps} steps, a save every {args.every}; "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads"
    )
    print(HEADER, flush=True)
    for layout in args.layouts.split(","):
        for asynchronous in (False, True):
            print(row(measure(args, layout, asynchronous)), flush=True)


if __name__ == "__main__":
    main()
