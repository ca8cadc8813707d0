"""The time-to-target study's verdict when nothing was confirmed: advice that follows from
what happened, not one sentence for every case.

Raising the autotune's budget helps only where the budget stopped something. A target your
command never reaches within its own ``trainer.max_epochs`` / ``max_steps`` is not found by
more trials: each trial gets your command's samples, so the advice there is to train longer
or to set an easier target. Which case it was is read from the baseline's figures
(:func:`baseline_stop`) and the study's trials (:func:`no_answer`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tuneup.autotune.confirm.inputs import ConfirmInputs

#: How the baseline ended without reaching the target: its own limits, or the autotune's time.
OWN_LIMITS, OUT_OF_TIME = "own_limits", "out_of_time"


def baseline_stop(summary: dict | None, limit_s: float, seconds: float) -> dict:
    """The baseline's best value of the metric, its direction (``target.mode=auto`` resolved)
    and, where it missed the target, why it stopped:
    ``out_of_time`` when it ran for the whole ``trainer.max_time`` the autotune gave it
    (``limit_s``), else ``own_limits`` (its epochs or steps, or its own stopping rule)."""
    target = (summary or {}).get("target") or {}
    missed = OUT_OF_TIME if seconds >= limit_s else OWN_LIMITS
    stopped = None if target.get("reached") else missed
    return {"best": target.get("best"), "mode": target.get("mode"), "stopped": stopped}


def no_answer(
    target: dict,
    baseline: dict,
    trials: int,
    budget_trials: int,
    hits: int,
    race_margin: float,
    best: float | None = None,
) -> str:
    """The verdict when no candidate was decided on paired seeds.

    ``target``: the user's target node (metric, value, mode); ``baseline``: the study's
    baseline figures (``reached``, ``samples_seen``, ``best``, ``stopped``); ``trials``: the
    study's finished trials (the baseline aside), of ``budget_trials``; ``hits``: those that
    reached the target; ``best``: the best value any run of this search logged."""
    mode = baseline.get("mode") or target.get("mode")  # the run's: auto resolved
    goal, seen = _goal(target, mode), _seen(target.get("metric"), mode, baseline.get("best"), best)
    kept = "your command is kept"
    if hits:
        return (
            f"{hits} study trial(s) reached {goal}, but the budget ran out before they "
            f"were confirmed on paired seeds: {kept}; raise autotune.budget_minutes"
        )
    if not baseline.get("reached"):
        samples = f"{baseline.get('samples_seen') or 0:,} samples"
        if baseline.get("stopped") == OUT_OF_TIME:
            return (
                f"your command did not reach {goal} before the autotune's time ran out "
                f"({samples}{seen}), nor did any study trial: {kept}; raise "
                "autotune.budget_minutes, or set an easier target.value"
            )
        others = (
            f"nor did any of the study's {trials} trial(s) with as many samples"
            if trials
            else "and the study ran no trial"
        )
        return (
            f"your command never reached {goal} within its own limits ({samples}{seen}), "
            f"{others}: {kept}; "
            "train longer (trainer.max_epochs or trainer.max_steps) or set an easier "
            "target.value (the autotune's budget did not stop it)"
        )
    if trials < budget_trials:  # the command reached it: its best value says nothing more
        return (
            f"the budget stopped the study after {trials} of autotune.budget_trials="
            f"{budget_trials} trials, none of which reached {goal}: {kept}; raise "
            "autotune.budget_minutes (or autotune.budget_samples)"
        )
    return (
        f"none of the study's {trials} trials reached {goal} within its samples budget "
        f"(your command's samples to target x autotune.race_margin={race_margin:g}): "
        f"{kept}; more trials (autotune.budget_trials), a wider space (autotune.params) or "
        "a larger autotune.race_margin may find one"
    )


def search_no_answer(search: ConfirmInputs) -> str:
    """:func:`no_answer` for a :class:`~tuneup.autotune.time_to_target.StudySearch`."""
    from optuna.trial import TrialState

    from tuneup.autotune.study.trials import BASELINE_ATTR

    target = dict((search.user_config or {}).get("target") or {})
    done = search.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    hits = sum(
        bool(t.user_attrs.get("reached")) and not t.user_attrs.get(BASELINE_ATTR) for t in done
    )
    values = [(t.figure("target") or {}).get("best") for t in search.lab.trials if t.summary]
    best = _pick(search.baseline.get("mode") or target.get("mode"), values)
    settings = search.settings
    return no_answer(
        target,
        search.baseline,
        len(search.explored()),
        settings.budget_trials,
        hits,
        settings.race_margin,
        best,
    )


def command_misses(search: ConfirmInputs, level: float) -> str:
    """Where the command missed the target on some of its paired seeds: how often, and the
    candidate that reached it on all of its own (the most seeds, then the least corrected
    p-value). The corrected test still decides, so the command is kept; a user who needs the
    target reached more than the time saved reads here which recipe reached it every time."""
    from tuneup.autotune.race import reached
    from tuneup.autotune.trials import BASELINE

    base = search.confirmed[BASELINE]["trials"]
    missed = sum(not reached(t) for t in base)
    if not missed:
        return ""
    text = f". Your command missed the target on {missed} of its {len(base)} paired seeds"
    steady = [
        (name, entry)
        for name, entry in search.confirmed.items()
        if name != BASELINE and entry["trials"] and all(map(reached, entry["trials"]))
    ]
    if not steady:
        return text
    name, entry = min(
        steady,
        key=lambda ne: (-len(ne[1]["trials"]), (ne[1].get("decision") or {}).get("p_adjusted", 1)),
    )
    p = (entry.get("decision") or {}).get("p_adjusted")
    why = f" (corrected p {p:.2g}, above the level {level:g})" if p is not None else ""
    return f"{text}; `{name}` reached it on all {len(entry['trials'])} of its own{why}"


def _goal(target: dict, mode: str | None) -> str:
    return f"{target.get('metric')} {'<=' if mode == 'min' else '>='} {target.get('value')}"


def _seen(metric, mode: str | None, command: float | None, any_run: float | None) -> str:
    """``; best val/loss seen 0.412`` (and yours, where another run did better)."""
    best = _pick(mode, [command, any_run])
    if best is None:
        return ""
    mine = f" (your command's: {command:.4g})" if command is not None and best != command else ""
    return f"; best {metric} seen {best:.4g}{mine}"


def _pick(mode: str | None, values: list) -> float | None:
    found = [v for v in values if isinstance(v, int | float)]
    if not found:
        return None
    return min(found) if mode == "min" else max(found)
