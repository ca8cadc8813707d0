"""autotune.json of the time-to-target study (time_to_target.py); report/study_markdown.py draws
autotune.md from it."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

from tuneup.autotune.confirm.seeds import held_out_seed, paired_seeds
from tuneup.autotune.race import reached
from tuneup.autotune.report.record import trial_dict
from tuneup.autotune.study.space import searched
from tuneup.autotune.study.trials import (
    STEPS,
    TIME,
    UNITS,
    lattice_gap,
    samples_seen,
    seed_figure,
    steps_seen,
)
from tuneup.autotune.trials import BASELINE
from tuneup.stats import paired

if TYPE_CHECKING:
    from tuneup.autotune.report.inputs import StudyAnswer

#: What ``autotune.cost`` ranks by, and why (autotune.md's first lines).
COST_WHY = {
    TIME: "time to target on this machine: each run's optimizer steps x its own seconds per "
    "step (its fastest speed window) + its validations' seconds; a faster step that needs "
    "more steps loses, as in the race",
    STEPS: "optimizer steps to target: every step costs the same, the proxy for a GPU that "
    "small batches do not fill (searching here to train on another machine)",
    "samples": "samples to target: exact and repeatable, but they reward a smaller batch "
    "without limit",
}


def build_study_record(search: StudyAnswer, command: list[str], recipe: dict) -> dict:
    confidence, cost = search.settings.confidence, search.settings.cost
    confirmed = []
    hits = {
        name: [t.figure("samples_to_target") for t in e["trials"] if reached(t)]
        for name, e in search.confirmed.items()
    }
    # the seeds' spread, pooled over the configurations that reached on all their seeds
    spread = paired.pooled_spread(
        [hits[n] for n, e in search.confirmed.items() if len(hits[n]) == len(e["trials"])],
        log=True,
    )
    used = max((len(e["trials"]) for e in search.confirmed.values()), default=0)
    seeds = paired_seeds(search)[:used]
    for name, entry in search.confirmed.items():
        runs = entry["trials"]
        samples = [t.figure("samples_to_target") if reached(t) else None for t in runs]
        costs = [seed_figure(t, cost)[0] for t in runs]
        times = [t.figure("time_to_target_s") for t in runs if reached(t)]
        lattice = sorted(lattice_gap(t, "samples") for t in runs)  # the samples' lattice
        row = {
            "label": name,
            "overrides": list(entry["overrides"]),
            "study_trial": entry["trial"],
            "jobs": [t.job for t in runs],
            "seeds": seeds[: len(runs)],
            "reached": all(reached(t) for t in runs),
            "cost": costs,
            "cost_interval": paired.mean_interval(costs, confidence, floor=0.0),
            "samples_to_target": samples,
            "steps_to_target": [steps_seen(t) if reached(t) else None for t in runs],
            "samples_prediction": paired.prediction_interval(
                hits[name],
                confidence,
                spread=spread,
                quantum=lattice[len(lattice) // 2] if lattice else 0.0,
            ),
            "samples_interval": paired.mean_interval(
                [s for s in samples if s is not None], confidence, floor=0.0
            ),
            "measured_time_s": times,
            "measured_time_interval": paired.mean_interval(times, confidence, floor=0.0),
            "decision": entry.get("decision"),
            "estimated_time": None,
            "samples_budget": entry.get("samples_budget"),
            "held_out": _held_out(entry.get("held_out"), held_out_seed(search)),
        }
        confirmed.append(row)
    speed = None
    if search.speed is not None:
        s = search.speed
        speed = {
            "rounds": len(s.pairs),
            "source": s.source,  # the interleaved rounds, or the paired seeds' runs
            "pairs": s.pairs,
            "jobs": [t.job for t in s.trials],
            "seconds_per_step": {
                "baseline": s.seconds_per_step(BASELINE),
                "pick": s.seconds_per_step("pick"),
            },
            "seconds_per_step_ratio": s.ratio(),
            "steps_ratio": s.steps_ratio(),
            "samples_ratio": s.samples_ratio(),
            "time_ratio": s.time_ratio(),
            "time_verdict": s.time_verdict(),
        }
        for row in confirmed:
            if row["label"] == BASELINE:
                row["estimated_time"] = s.estimate(search.confirmed[BASELINE], BASELINE)
            elif row["label"] == " ".join(s.pick["overrides"]):
                row["estimated_time"] = s.estimate(s.pick, "pick")
    mine = next((r for r in confirmed if r["overrides"] == list(search.recipe)), {})
    summary = search.lab.trials[0].summary if search.lab.trials else {}
    study = search.study
    return {
        "objective": "time_to_target",
        "method": "study",
        "device": (summary or {}).get("device"),
        "command": command,
        "target": {
            k: ((summary or {}).get("target") or {}).get(k) for k in ("metric", "value", "mode")
        },
        "settings": dataclasses.asdict(search.settings),
        "cost": {"name": cost, "unit": UNITS[cost], "why": COST_WHY[cost]},
        "elapsed_seconds": search.budget.elapsed,
        "seeds": {"explore": search.seed, "confirm": seeds, "held_out": held_out_seed(search)},
        "study": {
            "name": study.study_name,
            "storage": search.storage,
            "open": f"optuna.load_study(study_name={study.study_name!r}, "
            f"storage={_storage_arg(search.storage)})",
        },
        "space": {
            "params": {k: repr(d) for k, d in search.space.distributions.items()},
            "fixed": search.space.fixed,
            "searched": searched(search.space),
            "implied": search.space.implied,
            "left_out": [{"override": o, "reason": r} for o, r in search.space.dropped],
            "never_launched": [{"override": o, "reason": r} for o, r in search.space.dropped],
        },
        "baseline": search.baseline,
        "explore": [_study_trial(t) for t in study.get_trials(deepcopy=False)],
        "confirmed": confirmed,
        "speed": speed,
        "verdict": search.verdict,
        "notes": search.notes,
        "recipe": {
            **recipe,
            "found": list(search.recipe),
            "expected": mine.get("held_out"),
            "samples_to_target_paired": mine.get("samples_interval"),
            "samples_to_target_next_seed": mine.get("samples_prediction"),
        },
        "trials": [{**trial_dict(t), **_curve(t)} for t in search.lab.trials],
    }


def _held_out(trial, seed: int) -> dict | None:
    """The pick's run on the held-out seed: what it is expected to need (a miss: the samples,
    steps and seconds it ran, ``reached`` false)."""
    if trial is None:
        return None
    hit = reached(trial)
    history = trial.figure("target_history") or [{}]
    return {
        "seed": seed,
        "job": trial.job,
        "reached": hit,
        "samples_to_target": trial.figure("samples_to_target") if hit else samples_seen(trial),
        "steps_to_target": trial.figure("steps_to_target") if hit else trial.figure("steps"),
        "time_to_target_s": trial.figure("time_to_target_s") if hit else history[-1].get("time_s"),
    }


def _storage_arg(storage: str) -> str:
    if "://" in storage:
        return repr(storage)
    return (
        f"optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend({storage!r}))"
    )


def _study_trial(trial) -> dict:
    """A study trial, with its run's curve read back from its summary.json (a continued
    search's earlier trials ran in the killed process)."""
    import json

    attrs = trial.user_attrs
    curve = None
    run_dir = attrs.get("tuneup_run_dir")
    if run_dir and (Path(run_dir) / "summary.json").is_file():
        history = json.loads((Path(run_dir) / "summary.json").read_text()).get("target_history")
        curve = {key: [e[key] for e in history or []] for key in ("samples", "time_s", "value")}
    return {
        "number": trial.number,
        "state": trial.state.name,
        "value": trial.value,
        "params": trial.params,
        "overrides": attrs.get("tuneup_overrides"),
        "job": attrs.get("tuneup_job"),
        "baseline": bool(attrs.get("tuneup_baseline")),
        "reached": attrs.get("reached"),
        "pruned_at_samples": attrs.get("pruned_at_samples"),
        "samples_seen": attrs.get("samples_seen"),
        "cost": attrs.get("cost"),
        "steps": attrs.get("steps"),
        "step_s": attrs.get("step_s"),
        "never_launched": attrs.get("tuneup_never_launched"),
        "error": attrs.get("error"),
        "curve": curve,
    }


def _curve(trial) -> dict:
    history = trial.figure("target_history") or []
    return {
        "reached": (trial.figure("target") or {}).get("reached"),
        "samples_to_target": trial.figure("samples_to_target"),
        "time_to_target_s": trial.figure("time_to_target_s"),
        "curve": {
            "samples": [e["samples"] for e in history],
            "time_s": [e["time_s"] for e in history],
            "value": [e["value"] for e in history],
        },
    }
