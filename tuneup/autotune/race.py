"""What makes a run a race to the target, shared by the time-to-target study
(time_to_target.py) and the pick's timing (confirm/speed.py): the settings of a race trial, the
target a search needs, and whether a trial reached it."""

from __future__ import annotations

import math

from tuneup import TuneupError
from tuneup.autotune.trials import Trial, max_time, trial_settings

TIME_TO_TARGET = "time_to_target"
NO_TARGET = ("target.metric=null", "target.value=null")
STEP_LIMITS = ("trainer.max_steps=", "trainer.max_epochs=")


def race_settings(limit_s: float | None = None) -> list[str]:
    """What makes a run a race trial: it stops at its target, writes no checkpoints, prints
    one line, and stops at ``limit_s`` seconds (counted as not reached)."""
    found = [
        "target.stop=true",
        "checkpoint=off",
        "trainer.enable_progress_bar=false",
        "measure.console_table=false",
    ]
    return found + ([max_time(limit_s)] if limit_s is not None else [])


def sample_limit(samples: int | None) -> list[str]:
    """A trial's budget of ``samples`` (None: none, the user's own limits): a stop the
    scheduler does not see (``target.max_samples``, plugins/target/). Cosine and WSD decay
    over ``trainer.max_steps`` / ``max_epochs``; those stay the user's, so a candidate is
    trained with the schedule its recipe will run (with its own batch size), only cut short."""
    return [] if samples is None else [f"target.max_samples={max(1, math.ceil(samples))}"]


def speed_settings(steps: int, batch: int, limit_s: float | None = None) -> list[str]:
    """A throughput trial of ``steps`` optimizer steps of ``batch`` samples (the speed stage's,
    confirm/speed.py), stopped by :func:`sample_limit`: no validation, the user's schedule."""
    found = [s for s in trial_settings(steps, limit_s) if not s.startswith(STEP_LIMITS)]
    return [*found, *sample_limit(steps * batch)]


def required_target(checks) -> dict:
    """The user's composed config, which a time-to-target search needs a target in: one that
    has none is refused before any trial."""
    config = checks.inspect(()).config
    target = (config or {}).get("target") or {}
    if not target.get("metric") or target.get("value") is None:
        raise TuneupError(
            "autotune.objective=time_to_target needs a target: add e.g. "
            "target.metric=val/acc target.value=0.9 (and target.check_every_n_steps=...)"
        )
    return config


def reached(trial: Trial) -> bool:
    return trial.ok and bool((trial.figure("target") or {}).get("reached"))
