"""autotune.json: everything the search did, in one file; autotune.md and autotune.png are
drawn from it (and a test holds it against the trials' own summary.json files)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING

from tuneup.autotune.speed.outcome import median_peak

if TYPE_CHECKING:
    from tuneup.autotune.report.inputs import SpeedAnswer

FILE_NAME = "autotune.json"


def interval_dict(interval) -> dict | None:
    if interval is None:
        return None
    return {
        "estimate": interval.estimate,
        "low": interval.low,
        "high": interval.high if math.isfinite(interval.high) else None,
        "repeats": interval.repeats,
        "confidence": interval.confidence,
        "verdict": interval.verdict,
    }


def trial_dict(trial) -> dict:
    return {
        "job": trial.job,
        "label": trial.label,
        "overrides": list(trial.overrides),
        "status": (trial.summary or {}).get("status", "no summary.json"),
        "error": None if trial.ok else trial.error,
        "speed": trial.speed,
        "seconds": trial.seconds,
        "steps": trial.steps,
        "device": trial.figure("device"),  # on a CPU with its threads
        "worker": trial.worker or None,  # autotune.workers > 1: its share ("GPU 1", "2 thread(s)")
        **{
            key: trial.figure(key)
            for key in (
                "samples_per_s",
                "samples_per_s_windows",
                "peak_memory_bytes",
                "gpu_power_w",
            )
        },
    }


def outcome_dict(outcome) -> dict:
    return {
        "dimension": outcome.dimension,
        "candidate": list(outcome.candidate),
        "label": outcome.label,
        "against": outcome.against,
        "verdict": outcome.verdict,
        "reason": outcome.reason,
        "interval": interval_dict(outcome.interval),
        "trials": [t.job for t in outcome.trials],
        "loss_gap": outcome.loss_gap,
        "peak_memory_bytes": outcome.peak_memory_bytes,
        "reference_peak_memory_bytes": outcome.reference_peak_memory_bytes,
    }


def build_record(search: SpeedAnswer, command: list[str], recipe: dict, projection: dict) -> dict:
    baseline = search.baseline.summary or {}
    confirmation = search.confirmation
    return {
        "device": baseline.get("device"),
        "command": command,
        "settings": dataclasses.asdict(search.settings),
        "elapsed_seconds": search.budget.elapsed,
        "recipe": {**recipe, "found": list(search.recipe)},
        "speed_up": interval_dict(confirmation.interval(search.settings.confidence))
        if confirmation
        else None,
        "baseline_peak_memory_bytes": median_peak(confirmation.reference_trials)
        if confirmation
        else None,
        "recipe_peak_memory_bytes": median_peak(confirmation.trials) if confirmation else None,
        "path": [outcome_dict(o) for o in search.outcomes],
        "batch_notes": list(search.batch_notes),
        "projection": projection,
        "trials": [trial_dict(t) for t in search.lab.trials],
    }


def write_record(sweep_dir: Path, record: dict) -> Path:
    path = Path(sweep_dir) / FILE_NAME
    path.write_text(json.dumps(record, indent=2, default=str) + "\n")
    return path
