"""The race on CPU: baseline vs a hand-made recipe vs AlgoPerf's protocol vs autotune's pick.

Two real data sets that ship with every install (nothing downloaded):

- ``data=digits`` (scikit-learn's handwritten digits), a small MLP, to val/acc >= 0.95;
- ``data=python_source`` (the standard library's own .py files), a 2-block GPT, to
  val/loss <= 3.1.

For each: autotune's pick comes from ``experiment=autotune autotune.objective=time_to_target``
(on its own seeds, from the task's ``seed``); AlgoPerf's pick from its external-tuning protocol
for its baseline (``algoperf_trials``): NAdamW with linear warm-up and cosine decay, 5
quasi-random trials from its search space, each trained to the target on the search seed,
the one with the fewest samples to target kept. Then the baseline, the hand-made recipe and
the two picks are each run to the target (``target.stop=true``) in the seeds given (default
10, 11, 12: seeds neither search saw), one ``tuneup -m seed=...`` sweep each, and the table
gives each one's time to target and samples to target per seed. Prints a markdown table.

    python bench/race.py                     # each task within 10 minutes of search on 2 idle cores, then 12 x 3 runs
    python bench/race.py --runs algoperf --tasks digits   # one contender
    python bench/race.py --seeds 10 11 12 13 --tasks digits
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUIET = ["checkpoint=off", "trainer.enable_progress_bar=false", "measure.console_table=false"]

TASKS = {
    "digits": {
        "command": ["data=digits", "model=mlp", "model.hidden=[64]", "data.image_size=8",
                    "data.channels=1", "trainer.max_epochs=30", "target.metric=val/acc",
                    "target.value=0.95", "target.check_every_n_steps=5"],
        "hand": ["optimizer.lr=0.2", "label_smoothing=on", "ema=on"],
        "step_hint": 660,  # the run's length for the schedule: 30 epochs x 22 steps (1,437 / 64)
        "dimensions": "[optimizer,batch_size,label_smoothing,ema]",
    },
    "python_source": {
        "command": ["data=python_source", "model=gpt", "model.layers=2", "model.width=64",
                    "data.context=64", "data.max_bytes=300000", "data.val_samples=64",
                    "data.batch_size=32", "optimizer=adamw", "trainer.max_steps=300",
                    "trainer.max_epochs=-1", "target.metric=val/loss", "target.value=3.1",
                    "target.check_every_n_steps=10"],
        "hand": ["optimizer.lr=0.003"],
        "step_hint": 300,  # trainer.max_steps
        "dimensions": "[optimizer,batch_size,ema]",
    },
}  # fmt: skip


def tuneup(args: list[str]) -> None:
    done = subprocess.run([sys.executable, str(ROOT / "run.py"), *args], capture_output=True,
                          text=True, cwd=ROOT)  # fmt: skip
    if done.returncode:
        raise SystemExit(f"failed: {shlex.join(args)}\n{done.stderr[-2000:]}")


def autotune_pick(task: dict, folder: Path, minutes: float, trials: int) -> tuple[list[str], dict]:
    """The time-to-target study's pick (docs/autotune.md): its overrides, and its measured time
    to target on the study's paired seeds (its samples to target: printed to stderr)."""
    sweep = folder / "autotune"
    tuneup(["-m", "experiment=autotune", "autotune.objective=time_to_target",
            f"autotune.budget_minutes={minutes}", f"autotune.budget_trials={trials}",
            f"hydra.sweep.dir={sweep}", *task["command"]])  # fmt: skip
    record = json.loads((sweep / "autotune.json").read_text())
    recipe = record["recipe"]
    row = next((r for r in record["confirmed"] if r["overrides"] == recipe["found"]), {})
    samples = recipe["samples_to_target"] or {"estimate": 0, "low": 0, "high": 0}
    new = recipe["samples_to_target_next_seed"] or {}
    print(f"autotune pick {recipe['found']}: samples to target on seeds "
          f"{record['seeds']['confirm']}: {row.get('samples_to_target')}, mean "
          f"{samples['estimate']:.0f} [{samples['low']:.0f}, {samples['high']:.0f}], a new seed "
          f"[{new.get('low', 0):.0f}, {new.get('high', 0):.0f}]; {record['verdict']}",
          file=sys.stderr)  # fmt: skip
    return recipe["found"], row.get("measured_time_interval") or samples


def algoperf_trials(task: dict, trials: int = 5, seed: int = 0) -> list[list[str]]:
    """AlgoPerf's external-tuning protocol for its baseline (mlcommons/algorithmic-efficiency,
    algorithms/paper_baselines/nadamw): NAdamW, linear warm-up over 5 % of the run, cosine
    decay to 0; ``trials`` quasi-random points (scrambled Halton, as AlgoPerf's own
    quasi-random search) from its tuning_search_space.json: learning_rate in [1e-4, 1e-2],
    1 - beta1 in [4e-3, 0.1], weight_decay in [5e-3, 1] (all log), beta2 0.999, label smoothing
    0.1 or 0.2. Its dropout_rate (0 or 0.1) has no counterpart in these models: 0."""
    from scipy.stats import qmc

    def log_scale(u: float, low: float, high: float) -> float:
        return math.exp(math.log(low) + u * (math.log(high) - math.log(low)))

    warmup = round(0.05 * task["step_hint"])
    found = []
    for u in qmc.Halton(d=4, scramble=True, seed=seed).random(trials):
        beta1 = 1 - log_scale(u[1], 4e-3, 0.1)
        found.append(["optimizer=nadamw", f"optimizer.lr={log_scale(u[0], 1e-4, 1e-2):.4g}",
                      f"optimizer.betas=[{beta1:.4g},0.999]",
                      f"optimizer.weight_decay={log_scale(u[2], 5e-3, 1.0):.4g}",
                      "label_smoothing=on", f"label_smoothing.amount={0.1 if u[3] < 0.5 else 0.2}",
                      "scheduler=cosine", f"scheduler.warmup_steps={warmup}"])  # fmt: skip
    return found


def algoperf_pick(task: dict, folder: Path) -> tuple[list[str], list[dict]]:
    """Each of AlgoPerf's trials trained to the target on the search seed (0); the one with
    the fewest samples to target (a trial that misses ranks last), and every trial's summary."""
    summaries = []
    for i, extra in enumerate(algoperf_trials(task)):
        summaries.append(race(task, extra, [0], folder / f"algoperf-{i}")[0])
    ranked = sorted(range(len(summaries)),
                    key=lambda i: summaries[i].get("samples_to_target") or math.inf)  # fmt: skip
    return algoperf_trials(task)[ranked[0]], summaries


def race(task: dict, extra: list[str], seeds: list[int], folder: Path) -> list[dict]:
    seeds_arg = "seed=" + ",".join(map(str, seeds))
    tuneup(["-m", seeds_arg, f"hydra.sweep.dir={folder}", *task["command"], *extra,
            "target.stop=true", *QUIET])  # fmt: skip
    return [json.loads((folder / str(i) / "summary.json").read_text()) for i in range(len(seeds))]


def cell(summaries: list[dict], key: str, digits: int) -> str:
    values = [s.get(key) for s in summaries]
    shown = ", ".join("not reached" if v is None else f"{v:.{digits}f}" for v in values)
    reached = [v for v in values if v is not None]
    median = f"{statistics.median(reached):.{digits}f}" if len(reached) == len(values) else "-"
    return f"{median} ({shown})"


RUNS = ("baseline", "hand", "algoperf", "autotune")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[10, 11, 12])
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    parser.add_argument("--runs", nargs="+", default=list(RUNS), choices=RUNS,
                        help="which contenders (default: all four)")  # fmt: skip
    parser.add_argument("--autotune-minutes", type=float, default=10.0)
    parser.add_argument("--autotune-trials", type=int, default=100,
                        help="the study's trials; the minutes bind first on a slow task")  # fmt: skip
    parser.add_argument("--out", help="keep the runs here (default: a temporary folder)")
    args = parser.parse_args()
    rows, notes = [], []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = args.out or tmp
        for name in args.tasks:
            task, folder = TASKS[name], Path(tmp) / name
            contenders = {"baseline": ("baseline", []), "hand": ("hand-made", task["hand"])}
            if "algoperf" in args.runs:
                algoperf, trials = algoperf_pick(task, folder)
                contenders["algoperf"] = ("AlgoPerf's protocol", algoperf)
                notes.append(
                    f"{name}: AlgoPerf's 5 trials on seed 0, samples to target: "
                    + ", ".join(str(s.get("samples_to_target") or "not reached") for s in trials)
                )
            if "autotune" in args.runs:
                pick, _ = autotune_pick(task, folder, args.autotune_minutes, args.autotune_trials)
                contenders["autotune"] = ("autotune's pick", pick)
            for run in args.runs:
                who, extra = contenders[run]
                found = race(task, extra, args.seeds, folder / f"race-{run}")
                rows.append((name, who, " ".join(extra) or "-", found))
    print(f"seeds {', '.join(map(str, args.seeds))}; median (per seed)\n")
    print("| data | run | overrides | time to target, s | samples to target | steps |")
    print("|---|---|---|---:|---:|---:|")
    for name, who, extra, found in rows:
        print(f"| {name} | {who} | `{extra}` | {cell(found, 'time_to_target_s', 2)} | "
              f"{cell(found, 'samples_to_target', 0)} | {cell(found, 'steps_to_target', 0)} |")  # fmt: skip
    for name in args.tasks:
        print(f"\n{name}: `{' '.join(TASKS[name]['command'])}`")
    print("", *notes, sep="\n")


if __name__ == "__main__":
    main()
