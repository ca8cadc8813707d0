"""bench/race.py's runs: training to the target, the hand rule, AlgoPerf's baseline, searches.

Runs to the target train in this process (``tuneup.run``, as the autotune's basic launcher
runs its trials: no start-up per run); a search is a ``tuneup -m experiment=autotune`` sweep
in a process of its own.
"""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

from race_tasks import ROOT

QUIET = ["checkpoint=off", "trainer.enable_progress_bar=false", "measure.console_table=false"]
RACE = ["target.stop=true", *QUIET]
#: The hand rule: the default's learning rate times each, on seed 0 (issue 50).
LR_FACTORS = (1 / 3, 1, 3, 10)


def train(args: list[str], folder: Path) -> dict:
    """One run in this process; its summary, or ``{"status": "failed", "error": ...}``."""
    import logging
    import warnings

    import tuneup

    for name in ("pytorch_lightning", "lightning.pytorch", "lightning_fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)  # hundreds of runs: no tips, no notices
    warnings.filterwarnings("ignore", module="pytorch_lightning")

    folder = Path(folder)
    try:
        tuneup.run(tuneup.compose(args), run_dir=folder)
    except Exception as exc:  # a failed run is a finding of the race, not the end of it
        first = (str(exc).strip() or type(exc).__name__).splitlines()[0]
        return {"status": "failed", "error": first, "run_dir": str(folder)}
    return json.loads((folder / "summary.json").read_text())


def race(
    command: list[str], extra: list[str], seeds, folder: Path, limit: list[str] = ()
) -> list[dict]:
    """``extra`` on top of the task's command, trained to the target on each seed."""
    return [train([*command, *extra, f"seed={seed}", *RACE, *limit], Path(folder) / f"seed{seed}")
            for seed in seeds]  # fmt: skip


def steps_or_inf(summary: dict) -> float:
    value = summary.get("steps_to_target")
    return math.inf if value is None else value


def hand_rule(command, folder: Path, limit=()) -> tuple[list[str], list[str]]:
    """The best of the default's ``optimizer.lr`` x LR_FACTORS on seed 0, by steps to target
    (a miss ranks last; a tie keeps the factor nearer 1): its overrides and a note."""
    import tuneup

    lr = float(tuneup.compose(command).optimizer.lr)
    probes = [[f"optimizer.lr={lr * f:.4g}"] for f in LR_FACTORS]
    found = [race(command, p, [0], Path(folder) / f"lr{i}", limit)[0] for i, p in enumerate(probes)]
    order = sorted(
        range(len(probes)), key=lambda i: (steps_or_inf(found[i]), abs(math.log(LR_FACTORS[i])))
    )
    note = ", ".join(f"x{f:.3g}: {_steps(s)}" for f, s in zip(LR_FACTORS, found, strict=True))
    return probes[order[0]], [f"hand rule, steps to target on seed 0 (lr {lr:.4g}) {note}"]


def algoperf_trials(step_hint: int, gpt: bool, trials: int = 5, seed: int = 0) -> list[list[str]]:
    """AlgoPerf's external-tuning baseline: NAdamW with linear warm-up and cosine decay over
    ``step_hint`` steps (warm-up: int(warmup_factor x step_hint) steps, then cosine over the
    rest), as mlcommons/algorithmic-efficiency's
    algorithms/baselines/external_tuning/pytorch_nadamw_full_budget.py (commit 49c5388)
    schedules it; ``trials`` quasi-random points (scrambled Halton, as AlgoPerf's
    quasi-random search) from the NAdamW baseline's tuning_search_space.json
    (algorithms/paper_baselines/nadamw, commit 0ac2dbe): learning_rate in [1e-4, 1e-2],
    1 - beta1 in [4e-3, 0.1], weight_decay in [5e-3, 1] (all log), beta2 0.999,
    warmup_factor 0.05, label_smoothing 0.1 or 0.2, dropout_rate 0 or 0.1 (the GPT's
    ``model.dropout``; the other models have none: 0). The schedule ends at step_hint:
    ``trainer.max_steps=step_hint``, the horizon tuneup's cosine decays over."""
    from scipy.stats import qmc

    def log_scale(u: float, low: float, high: float) -> float:
        return math.exp(math.log(low) + u * (math.log(high) - math.log(low)))

    warmup = int(0.05 * step_hint)
    found = []
    for u in qmc.Halton(d=5, scramble=True, seed=seed).random(trials):
        beta1 = 1 - log_scale(u[1], 4e-3, 0.1)
        found.append(["optimizer=nadamw", f"optimizer.lr={log_scale(u[0], 1e-4, 1e-2):.4g}",
                      f"optimizer.betas=[{beta1:.4g},0.999]",
                      f"optimizer.weight_decay={log_scale(u[2], 5e-3, 1.0):.4g}",
                      "label_smoothing=on", f"label_smoothing.amount={0.1 if u[3] < 0.5 else 0.2}",
                      "scheduler=cosine", f"scheduler.warmup_steps={warmup}",
                      f"trainer.max_steps={step_hint}", "trainer.max_epochs=-1",
                      *([f"model.dropout={0.0 if u[4] < 0.5 else 0.1}"] if gpt else [])])  # fmt: skip
    return found


def algoperf_pick(command, step_hint: int, folder: Path, trials: int = 5, limit=()):
    """Each trial trained to the target on seed 0; the one with the fewest steps (AlgoPerf
    keeps the trial fastest to the target; the batch is the task's in every trial)."""
    gpt = "model=gpt" in command
    candidates = algoperf_trials(step_hint, gpt, trials)
    found = [race(command, c, [0], Path(folder) / f"algoperf{i}", limit)[0]
             for i, c in enumerate(candidates)]  # fmt: skip
    best = min(range(len(found)), key=lambda i: steps_or_inf(found[i]))
    note = ", ".join(_steps(s) for s in found)
    return candidates[best], [f"AlgoPerf's {trials} trials, steps to target on seed 0: {note}"]


def search(command, overrides: list[str], folder: Path) -> tuple[list[str], str, dict | None]:
    """One autotune search (a sweep in its own process): the pick's overrides (empty: the
    command was kept), its verdict, and its stated interval for a new seed's samples to
    target (``recipe.samples_to_target_next_seed``; None where it states none)."""
    sweep = Path(folder)
    args = [sys.executable, str(ROOT / "run.py"), "-m", *overrides, f"hydra.sweep.dir={sweep}",
            *command]  # fmt: skip
    done = subprocess.run(args, capture_output=True, text=True, cwd=ROOT)
    sweep.mkdir(parents=True, exist_ok=True)
    (sweep / "search.log").write_text(done.stdout + done.stderr)
    record = sweep / "autotune.json"
    if done.returncode or not record.is_file():
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return [], f"search failed ({tail}); the default stands in", None
    found = json.loads(record.read_text())
    recipe = found.get("recipe") or {}
    interval = recipe.get("samples_to_target_next_seed")
    return list(recipe.get("found") or []), str(found.get("verdict") or ""), interval or None


def median_steps(summaries: list[dict]) -> float:
    """The median steps to target over the seeds, a miss counted as infinitely many."""
    return statistics.median([steps_or_inf(s) for s in summaries])


def _steps(summary: dict) -> str:
    if summary.get("status") == "failed":
        return f"failed ({summary.get('error')})"
    value = summary.get("steps_to_target")
    return "missed" if value is None else str(value)
