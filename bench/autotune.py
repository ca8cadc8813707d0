"""The autotune against the best hand-picked combination (experiment=ablation), on this machine.

1. ``python run.py -m experiment=ablation <shape>``: the ablation's best run (report.md's rule);
2. ``python run.py -m experiment=autotune <shape> autotune.budget_minutes=B``: the recipe;
3. the baseline, the ablation's best and the recipe run again as plain runs of ``--steps``
   steps, interleaved (B A R, R A B, ...) for ``--rounds`` rounds, each its own process:
   samples/s of each, and the recipe's speed-up over the ablation's best with its interval
   (the autotune's own rule, tuneup/stats/interval.py).

The autotune meets its goal when the recipe is at least as fast as the ablation's best (the
speed-up's interval reaches 1.0 or above). It prints Markdown for docs/autotune.md.

    python bench/autotune.py                                  # ResNet-50 at 224 px on a GPU
    python bench/autotune.py --model small_resnet --image-size 32 --classes 10 \\
        --accelerator cpu --budget 10 --steps 64 --rounds 2   # the default model on a CPU
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tuneup.report import build_report  # noqa: E402
from tuneup.stats.interval import paired, trial_speed  # noqa: E402


def shape(args) -> list[str]:
    """What every run shares: the model, the data, the device."""
    return [
        f"model={args.model}",
        f"data.image_size={args.image_size}",
        f"data.num_classes={args.classes}",
        f"data.train_samples={args.train_samples}",
        f"data.val_samples={args.batch_size}",
        f"trainer.accelerator={args.accelerator}",
        "trainer.enable_progress_bar=false",
        *args.extra,
    ]


def run(arguments: list[str], cwd: Path, timeout: float | None = None) -> float:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, str(ROOT / "run.py"), *arguments],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if done.returncode != 0:
        raise SystemExit(f"failed: run.py {' '.join(arguments)}\n{done.stderr[-3000:]}")
    return time.monotonic() - started


def ablation_best(args, out: Path) -> list[str]:
    sweep = out / "ablation"
    run(["-m", "experiment=ablation", *shape(args), f"hydra.sweep.dir={sweep}"], out)
    best = build_report(sweep).best
    return [o for o in best.overrides if o.startswith("+ablation=")]


def autotune(args, out: Path) -> tuple[Path, float]:
    sweep = out / "autotune"
    seconds = run(
        [
            "-m",
            "experiment=autotune",
            *shape(args),
            f"data.batch_size={args.batch_size}",
            f"autotune.budget_minutes={args.budget}",
            f"hydra.sweep.dir={sweep}",
        ],
        out,
    )
    return sweep, seconds


def measure(args, out: Path, configs: dict[str, list[str]]) -> dict[str, list[dict]]:
    """Each configuration once per round, the order reversed every round."""
    fixed = [
        f"trainer.max_steps={args.steps}",
        "trainer.max_epochs=-1",
        "checkpoint=off",
        "++trainer.limit_val_batches=0",
    ]
    found: dict[str, list[dict]] = {name: [] for name in configs}
    for number in range(args.rounds):
        names = list(configs)[:: -1 if number % 2 else 1]
        for name in names:
            run_dir = out / f"{name}-{number}"
            run([*shape(args), *configs[name], *fixed, f"hydra.run.dir={run_dir}"], out)
            found[name].append(json.loads((run_dir / "summary.json").read_text()))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument(
        "--batch-size", type=int, default=64, help="the ablation's, and the autotune's start"
    )
    parser.add_argument("--train-samples", type=int, default=8192)
    parser.add_argument("--accelerator", default="gpu")
    parser.add_argument("--budget", type=float, default=15, help="autotune.budget_minutes")
    parser.add_argument("--steps", type=int, default=100, help="steps of each final run")
    parser.add_argument(
        "--rounds", type=int, default=3, help="interleaved rounds of the final runs"
    )
    parser.add_argument(
        "--extra", nargs="*", default=[], help="more run.py overrides for every run"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder)
        best = ablation_best(args, out)
        sweep, seconds = autotune(args, out)
        record = json.loads((sweep / "autotune.json").read_text())
        recipe = ["--config-dir", str(sweep / "conf"), "experiment=recipe"]
        configs = {
            "baseline": [f"data.batch_size={args.batch_size}"],
            "ablation best": ["experiment=ablation", *best],
            "autotune recipe": recipe,
        }
        found = measure(args, out, configs)
    device = found["baseline"][0]["device"]
    print(
        f"{args.model} at {args.image_size} px on {device}; autotune: {seconds / 60:.1f} min "
        f"(budget {args.budget:g}), recipe `{' '.join(record['recipe']['found']) or '-'}`; "
        f"ablation best `{' '.join(best)}`; {args.rounds} interleaved rounds of {args.steps} steps\n"
    )
    print(
        "| configuration | samples/s (median) | fastest window (median) | against the ablation's best |"
    )
    print("|---|---:|---:|---:|")
    reference = [trial_speed(s) for s in found["ablation best"]]
    for name, summaries in found.items():
        speeds = sorted(s["samples_per_s"] for s in summaries)
        fastest = sorted(trial_speed(s) for s in summaries)
        interval = paired(reference, [trial_speed(s) for s in summaries], 0.95)
        print(
            f"| {name} | {speeds[len(speeds) // 2]:,.1f} | {fastest[len(fastest) // 2]:,.1f} | "
            f"{interval if name != 'ablation best' else '1x'} |"
        )


if __name__ == "__main__":
    main()
