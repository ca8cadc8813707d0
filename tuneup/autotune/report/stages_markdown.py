"""autotune.md's "Stages" section (``autotune.stages``, pipeline.py): what the speed stage
adopted and what each stage bought in time to target, drawn from autotune.json's ``stages``."""

from __future__ import annotations

from tuneup.autotune.report.markdown import path_table
from tuneup.report.cells import code, escape


def stages_lines(record: dict) -> list[str]:
    """The section, or nothing for a study run alone (``autotune.stages=[study]``)."""
    stages = record.get("stages") or {}
    speed = stages.get("speed")
    if speed is None:
        return []
    study = stages["study"]
    lines = ["## Stages", "", f"1. **Speed** {_speed_text(speed)}"]
    on = (
        "on your command with the speed stage's recipe: its `baseline` below"
        if speed["adopted"]
        else "on your command as it is"
    )
    lines += [f"2. **Study** ({on}): {_study_text(study, speed)}", ""]
    launched = [o for o in speed["path"] if o["trials"]]
    if launched:
        lines += ["The speed stage's path:", "", *path_table(speed), ""]
    never = [o for o in speed["path"] if not o["trials"]]
    if never:
        lines += ["Never launched by the speed stage:", ""]
        lines += [
            f"- {o['dimension']}: {code(' '.join(o['candidate']) or '-')}: {o['verdict']}, "
            f"{escape(o['reason'])}"
            for o in never
        ]
        lines.append("")
    return lines


def _speed_text(speed: dict) -> str:
    took = (
        f"({len(speed['trials'])} throughput trials over "
        f"{', '.join(speed['dimensions']) or 'no dimension'}; "
        f"{speed['elapsed_seconds'] / 60:.1f} min of its {speed['budget_seconds'] / 60:.1f}-"
        "minute share: a third of autotune.budget_minutes at most, less where the study's "
        "need leaves less; the study has the rest)"
    )
    if not speed["adopted"]:
        return (
            f"{took}: adopted nothing: no feature was faster than your command beyond the "
            "noise on this machine, so the study ran on your command as it is."
        )
    up = speed["speed_up"]
    text = (
        f"{took}: adopted {code(' '.join(speed['adopted']))}: {_ratio(up)} your "
        f"command's speed ({up['confidence']:.0%} interval, {up['repeats']} interleaved rounds)."
    )
    steps, times = speed["steps_to_target"], speed["time_to_target_s"]
    if not steps or times["command"] is None or times["recipe"] is None:
        return text + " Its time to target: not estimated (no steps or no speed window)."
    per_step = speed["seconds_per_step"]
    at = (
        f"the study baseline's {steps:,} steps to the target"
        if speed["reached"]
        else f"the {steps:,} steps the study baseline ran (it missed the target: at least)"
    )
    return text + (
        f" Estimated time to target, at {at}: {times['recipe']:.3g} s with it "
        f"({per_step['recipe']:.3g} s/step) against {times['command']:.3g} s without "
        f"({per_step['command']:.3g} s/step): {_ratio(speed['time_ratio'])} your command's."
    )


def _study_text(study: dict, speed: dict) -> str:
    against = "the speed stage's recipe" if speed["adopted"] else "your command"
    if not study["adopted"]:
        return f"adopted nothing: {against} is kept (the verdict above)."
    ratio = study.get("time_ratio")
    bought = f": estimated time to target {_ratio(ratio)} {against}'s" if ratio else ""
    return f"adopted {code(' '.join(study['adopted']))}{bought}."


def _ratio(found: dict | None) -> str:
    """A ratio with its interval, ``0.5x [0.33, 0.67]`` (``inf``: no upper end)."""
    if not found or found.get("estimate") is None:
        return "-"
    if found.get("low") is None:
        return f"{found['estimate']:.3g}x"
    high = "inf" if found.get("high") is None else f"{found['high']:.3g}"
    return f"{found['estimate']:.3g}x [{found['low']:.3g}, {high}]"
