"""``autotune.stages``: one command from this machine's speed features to the hyperparameters.

::

    baseline    your command to its target (the study's baseline, time_to_target.py): it
                tells a run's time, so the study's need (one study trial and one
                confirmation, study/budget.py) is known before the speed stage spends
                anything; a budget too small for the study alone is refused there
    speed       the throughput walk (speed/search.py) on your command: autotune.dimensions but the
                batch size (the study searches the batch with its learning rate, to the target),
                measured as the throughput objective measures them (interleaved rounds, one
                trial at a time), within :func:`speed_seconds`: its share of
                autotune.budget_minutes (SPEED_SHARE), at most what the study's need leaves;
                skipped when that is less than its smallest useful run. What it adopts is its
                recipe
    study       the time-to-target study on your command plus that recipe: its baseline runs
                again on them (the reference of its comparisons; no recipe: the first one is
                it), and every study trial, confirmation and speed run has the recipe's
                overrides; it gets the rest of the budget, what the speed stage left included

The answer holds both stages' overrides; autotune.json's ``stages`` (:func:`stages_record`)
says what each adopted and what each bought in time to target. With ``stages=[study]`` the
study runs on your command as it is; ``stages=[speed]`` is the throughput objective's answer.
"""

from __future__ import annotations

import dataclasses
import logging
import statistics

from tuneup.autotune.race import NO_TARGET
from tuneup.autotune.report.record import interval_dict, outcome_dict, trial_dict
from tuneup.autotune.settings import BATCH, SPEED, STUDY, Settings
from tuneup.autotune.space import Checks
from tuneup.autotune.speed.budget import Budget
from tuneup.autotune.speed.search import Search
from tuneup.autotune.study import budget as study_budget
from tuneup.autotune.study.trials import step_seconds
from tuneup.autotune.trials import Lab, trial_settings

log = logging.getLogger(__name__)

#: The speed stage's share of autotune.budget_minutes, at most: it plans its rounds within it
#: (speed/search.py), and the study, whose need is kept out of it (:func:`speed_seconds`), keeps
#: the rest.
SPEED_SHARE = 1 / 3
#: autotune.md's note when the study's need leaves the speed stage less than its smallest run.
SKIPPED = "the speed stage was skipped: the budget holds the study's need only"


def speed_seconds(
    settings: Settings, left_s: float, need_s: float, run_s: float, space_s: float = 0.0
) -> float:
    """The speed stage's seconds: :data:`SPEED_SHARE` of the budget, at most what is left
    (``left_s``) above the study's need (``need_s``) and its start again on a recipe (its
    baseline, ``run_s``: a run to the target; its space built again, ``space_s``), with
    study/budget.py's spare, as a run's time varies on a shared machine; 0 (skipped) when
    that is less than :func:`smallest_speed_run`."""
    again = run_s + space_s
    share = min(
        settings.budget_seconds * SPEED_SHARE, left_s - study_budget.SPARE * (need_s + again)
    )
    return share if share >= smallest_speed_run(settings, run_s) else 0.0


def smallest_speed_run(settings: Settings, run_s: float) -> float:
    """The least a speed stage can decide in: its baseline trial and autotune.min_rounds
    rounds of the command and one candidate, each a short throughput trial taken at half a
    run to the target (the same start-up, a few steps: study/budget.py's speed_seconds)."""
    return max(1.0, run_s / 2) + study_budget.speed_seconds(settings.min_rounds, run_s)


def speed_settings(settings: Settings) -> Settings:
    """The speed stage's settings: autotune.dimensions without the batch size."""
    return dataclasses.replace(
        settings, dimensions=tuple(d for d in settings.dimensions if d != BATCH)
    )


def speed_line(command: list[str]) -> list[str]:
    """The user's command for a throughput trial of a time-to-target search: without its
    target, as the trial runs no validation to check it at (the recipe keeps it)."""
    return [*command, *NO_TARGET]


def run_speed(
    settings: Settings, launcher, sweep_dir, command, compose, first_job: int, seconds: float
):
    """The speed stage on the user's ``command``: throughput trials of autotune.trial_steps
    steps through the sweep's launcher, within ``seconds`` (:func:`speed_seconds`).
    ``compose``: the config a job with these overrides gets (the sweeper's)."""
    steps = settings.trial_steps
    line = speed_line(command)
    lab = Lab(launcher, sweep_dir, line, steps, first_job=first_job)
    checks = Checks(lambda overrides: compose([*line, *trial_settings(steps), *overrides]))
    budget = Budget(seconds)
    log.info("autotune: stage 1, speed: %.1f min at most", budget.seconds / 60)
    search = Search(speed_settings(settings), lab, checks, budget).run()
    adopted = " ".join(search.recipe)
    log.info(
        "autotune: the speed stage adopted %s",
        f"`{adopted}`" if adopted else "nothing: no feature was faster beyond the noise here",
    )
    return SpeedStage(search, budget.elapsed)


def speed_then_study(settings: Settings, search, speed_stage, study_on):
    """The stages before the study: the study's baseline (``search.prepare``), then the speed
    stage in what the study's need leaves (``speed_stage(seconds) -> SpeedStage``), then the
    study moved onto its recipe (``study_on(recipe) -> (lab, checks)``). Returns the speed
    stage, None when skipped (autotune.md's notes say so). A budget too small for the study
    alone is refused before the speed stage runs."""
    search.prepare()
    seconds = speed_seconds(
        settings,
        search.left(),
        search.study_need(),
        search.confirm_seconds(),
        search.space_seconds,
    )
    if not seconds:
        search.notes.append(SKIPPED)
        log.info("autotune: %s", SKIPPED)
        return None
    speed = speed_stage(seconds)
    search.before = (speed.seconds, SPEED_SHARE)
    log.info("autotune: stage 2, the study")
    search.after_speed(*study_on(speed.recipe), speed.recipe)
    return speed


@dataclasses.dataclass(frozen=True)
class SpeedStage:
    """The speed stage's search, and the seconds it took (its budget's clock runs on)."""

    search: Search
    seconds: float

    @property
    def recipe(self) -> tuple[str, ...]:
        return self.search.recipe


def study_command(command: list[str], speed: SpeedStage | None) -> list[str]:
    """What the study starts from: the user's command plus the speed stage's recipe."""
    return [*command, *(speed.recipe if speed else ())]


def stages_record(settings: Settings, speed: SpeedStage | None, study) -> dict:
    """autotune.json's ``stages``: the stages run, and what each adopted and bought."""
    return {
        "run": list(settings.run_stages),
        SPEED: None if speed is None else speed_record(speed, study.baseline),
        STUDY: {
            "adopted": list(study.recipe),
            "time_ratio": study.speed.time_ratio() if study.speed and study.recipe else None,
            "verdict": study.verdict,
        },
    }


def speed_record(stage: SpeedStage, baseline: dict) -> dict:
    """What the speed stage adopted (its confirmation's speed-up) and what it buys in time to
    target: the study baseline's steps to target (your command with the recipe, on the
    search seed; a miss: the steps it ran, a lower bound) x the seconds per step of your
    command and of the recipe, each the median of its trials in the confirmation's rounds;
    the ratio is the paired speed-up's inverse."""
    speed = stage.search
    contest = speed.confirmation if speed.recipe else None
    interval = contest.interval(speed.settings.confidence) if contest else None
    per_step = {
        "command": _median_step(contest.reference_trials) if contest else None,
        "recipe": _median_step(contest.trials) if contest else None,
    }
    reached = bool(baseline.get("reached"))
    steps = baseline.get("steps_to_target") if reached else baseline.get("steps")
    times = {k: steps * v if steps and v else None for k, v in per_step.items()}
    return {
        "dimensions": list(speed.settings.dimensions),
        "adopted": list(speed.recipe),
        "speed_up": interval_dict(interval),
        "seconds_per_step": per_step,
        "steps_to_target": steps,
        "reached": reached,  # false: the steps the baseline ran (a miss), so at least these
        "time_to_target_s": times,
        "time_ratio": _inverse(interval_dict(interval)),
        "elapsed_seconds": stage.seconds,
        "budget_seconds": speed.budget.seconds,
        "path": [outcome_dict(o) for o in speed.outcomes],
        "batch_notes": list(speed.batch_notes),
        "trials": [trial_dict(t) for t in speed.lab.trials],
    }


def _median_step(trials) -> float | None:
    found = [s for s in map(step_seconds, trials) if s]
    return statistics.median(found) if found else None


def _inverse(speed_up: dict | None) -> dict | None:
    """A speed-up's interval as a time ratio (recipe / command): 2x [1.5, 3] -> 0.5x [0.33, 0.67]."""
    if not speed_up:
        return None
    low, high = speed_up["low"], speed_up["high"]
    return {
        "estimate": 1 / speed_up["estimate"],
        "low": 0.0 if high is None else 1 / high,
        "high": 1 / low if low else None,
        "confidence": speed_up["confidence"],
    }
