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
    for module in ("pytorch_lightning", "lightning_fabric"):
        warnings.filterwarnings("ignore", module=module)

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
    return [
        train([*command, *extra, f"seed={seed}", *RACE, *limit], Path(folder) / f"seed{seed}")
        for seed in seeds
    ]


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


#: AlgoPerf v0.5.0's external-tuning baseline, its five trials: the points of
#: prize_qualification_baselines/external_tuning/tuning_search_space.json at the tag v0.5.0 of
#: mlcommons/algorithmic-efficiency (the same five in algorithms/baselines/external_tuning at
#: its head): learning_rate, one_minus_beta1, beta2, weight_decay, warmup_factor,
#: label_smoothing, dropout_rate.
ALGOPERF_V050 = (
    (0.001308209823469072, 0.02686663061, 0.9981232922116359, 0.16375311233774334, 0.1, 0.1, 0.0),
    (0.0008445074561975979, 0.11042418465, 0.9978504782314613, 0.08135402759553023, 0.05, 0.2, 0.0),
    (0.001308209823469072, 0.02686663061, 0.9981232922116359, 0.16375311233774334, 0.1, 0.0, 0.0),
    (0.004958460849689891, 0.13625575743, 0.6291854735396584, 0.1147386261512052, 0.02, 0.0, 0.0),
    (0.0017486387539278373, 0.06733926164, 0.9955159689799007, 0.08121616522670176, 0.02, 0.0, 0.1),
)


def algoperf_trials(step_hint: int, gpt: bool, trials: int = 5) -> list[list[str]]:
    """AlgoPerf v0.5.0's external-tuning baseline (``pytorch_nadamw_full_budget.py``): NAdamW
    (tuneup's ``optimizer=nadamw`` is its update), linear warm-up over
    int(warmup_factor x step_hint) steps, then cosine decay to 0 at ``step_hint``
    (``trainer.max_steps=step_hint``: the horizon tuneup's cosine decays over); the first
    ``trials`` of its five points (ALGOPERF_V050). Its dropout_rate is the GPT's
    ``model.dropout``; the other models have no dropout (0 there)."""
    found = []
    for lr, one_minus_beta1, beta2, decay, warmup, smoothing, dropout in ALGOPERF_V050[:trials]:
        found.append(
            [
                "optimizer=nadamw",
                f"optimizer.lr={lr:.6g}",
                f"optimizer.betas=[{1 - one_minus_beta1:.6g},{beta2:.6g}]",
                f"optimizer.weight_decay={decay:.6g}",
                *(
                    ["label_smoothing=on", f"label_smoothing.amount={smoothing}"]
                    if smoothing
                    else []
                ),
                "scheduler=cosine",
                f"scheduler.warmup_steps={int(warmup * step_hint)}",
                f"trainer.max_steps={step_hint}",
                "trainer.max_epochs=-1",
                *([f"model.dropout={dropout}"] if gpt else []),
            ]
        )
    return found


def algoperf_pick(command, step_hint: int, folder: Path, trials: int = 5, limit=()):
    """Each trial trained to the target on seed 0; the one with the fewest steps (AlgoPerf
    scores a study by its trial fastest to the target; the batch is the task's in every
    trial, as AlgoPerf's is the workload's)."""
    gpt = "model=gpt" in command
    candidates = algoperf_trials(step_hint, gpt, trials)
    found = [
        race(command, c, [0], Path(folder) / f"algoperf{i}", limit)[0]
        for i, c in enumerate(candidates)
    ]
    best = min(range(len(found)), key=lambda i: steps_or_inf(found[i]))
    note = ", ".join(_steps(s) for s in found)
    return candidates[best], [f"AlgoPerf's {trials} trials, steps to target on seed 0: {note}"]


def search(command, overrides: list[str], folder: Path) -> tuple[list[str], str, dict | None]:
    """One autotune search (a sweep in its own process): the pick's overrides (empty: the
    command was kept), its verdict, and its stated interval for a new seed's samples to
    target (``recipe.samples_to_target_next_seed``; None where it states none). The sweep
    runs from the checkout: its folder is passed as an absolute path."""
    sweep = Path(folder).resolve()
    args = [
        sys.executable,
        str(ROOT / "run.py"),
        "-m",
        *overrides,
        f"hydra.sweep.dir={sweep}",
        *command,
    ]
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
