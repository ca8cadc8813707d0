"""autotune.json and autotune.md of a race (``autotune.objective=time_to_target``)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from tuneup.autotune.markdown import unlaunched_and_batch
from tuneup.autotune.outcome import label
from tuneup.autotune.record import outcome_dict, trial_dict
from tuneup.report.markdown import code, escape


def build_race_record(search, command: list[str], recipe: dict) -> dict:
    confidence = search.settings.confidence
    entries = {name: e.as_dict(confidence) for name, e in search.entries.items()}
    path = []
    for outcome in search.outcomes:
        found = outcome_dict(outcome)
        raced = search.entries.get(label((*_recipe_at(search, outcome), *outcome.candidate)))
        found["time_to_target"] = raced.as_dict(confidence) if outcome.trials and raced else None
        path.append(found)
    baseline = search.baseline.summary or {}
    return {
        "objective": "time_to_target",
        "device": baseline.get("device"),
        "command": command,
        "target": {k: baseline.get("target", {}).get(k) for k in ("metric", "value", "mode")},
        "settings": dataclasses.asdict(search.settings),
        "elapsed_seconds": search.budget.elapsed,
        "seeds": search.seeds,
        "recipe": {
            **recipe,
            "found": list(search.recipe),
            "time_to_target": search.recipe_entry().as_dict(confidence),
        },
        "baseline": entries["baseline"],
        "ranking": [{"label": label(e.overrides), **e.as_dict(confidence)} for e in search.rank()],
        "path": path,
        "batch_notes": list(search.batch_notes),
        "trials": [{**trial_dict(t), **_race_figures(t)} for t in search.lab.trials],
    }


def _recipe_at(search, outcome) -> tuple[str, ...]:
    """The recipe a launched candidate was raced on (its ``against`` label's overrides)."""
    return () if outcome.against == "baseline" else tuple(outcome.against.split(" "))


def _race_figures(trial) -> dict:
    target = trial.figure("target") or {}
    return {
        "reached": target.get("reached"),
        "best": target.get("best"),
        **{
            k: trial.figure(k) for k in ("time_to_target_s", "steps_to_target", "samples_to_target")
        },
    }


def render_race_markdown(record: dict, sweep_dir: Path) -> str:
    target, settings = record["target"], record["settings"]
    mine = record["recipe"]["time_to_target"]
    found = " ".join(record["recipe"]["found"]) or "your command as it is"
    lines = [
        f"# Autotune (time to target): {Path(sweep_dir).name}",
        "",
        f"On {record['device']}: {record['elapsed_seconds'] / 60:.1f} min of a "
        f"{settings['budget_minutes']:g}-minute budget, {len(record['trials'])} trials; target "
        f"{target['metric']} {'>=' if target['mode'] == 'max' else '<='} {target['value']}, "
        f"seeds {', '.join(map(str, record['seeds']))}.",
        "",
        f"**Recipe: {code(found)}**: time to target {time_text(mine)} against the baseline's "
        f"{time_text(record['baseline'])} ({settings['confidence']:.0%} interval over the seeds).",
        "",
        f"Run it: `{record['recipe']['command']}` (the preset is `{record['recipe']['file']}`).",
        "",
        "## Ranking: time to target per configuration",
        "",
        "| # | configuration | time to target, mean [interval] | per seed (s) | steps | samples "
        "| reached |",
        "|---:|---|---:|---|---:|---:|---|",
    ]
    for number, e in enumerate(record["ranking"], start=1):
        seeds = ", ".join(f"{t:.3g}" for t in e["time_to_target_s"]) or "-"
        missed = f"**no** ({e['runs']} of {e['seeds']} seeds run)"
        lines.append(
            f"| {number} | {code(e['label'])} | {time_text(e)} | {seeds} | "
            f"{_value(e['steps_to_target'])} | {_value(e['samples_to_target'])} | "
            f"{'yes' if e['reached'] else missed} |"
        )
    lines += ["", "## The path", "", "| dimension | candidate | against | outcome |",
              "|---|---|---|---|"]  # fmt: skip
    for o in record["path"]:
        if o["trials"]:
            lines.append(f"| {o['dimension']} | {code(o['label'])} | {code(o['against'])} | "
                         f"**{o['verdict']}**: {escape(o['reason'])} |")  # fmt: skip
    lines += unlaunched_and_batch(record)
    lines += ["", "## Trials", "", "| job | configuration | reached | best | time to target (s) "
              "| steps | seconds | status |", "|---:|---|---|---:|---:|---:|---:|---|"]  # fmt: skip
    for t in record["trials"]:
        status = t["status"] if not t["error"] else f"{t['status']}: {t['error']}"
        lines.append(f"| {t['job']} | {code(' '.join(t['overrides']) or 'baseline')} | "
                     f"{t['reached']} | {_value(t['best'])} | {_value(t['time_to_target_s'])} | "
                     f"{_value(t['steps'])} | {t['seconds']:.1f} | {escape(status)} |")  # fmt: skip
    lines += ["", *_method(settings)]
    return "\n".join(lines) + "\n"


def time_text(entry: dict) -> str:
    interval = entry.get("interval")
    if not entry.get("reached") or not interval:
        return "not reached"
    return f"{interval['estimate']:.3g} s [{interval['low']:.3g}, {interval['high']:.3g}]"


def _method(settings: dict) -> list[str]:
    return [
        "## How it was measured",
        "",
        f"- Every configuration trained to the target (target.stop=true) in each of "
        f"{settings['seeds']} seeds, one trial at a time; the time is summary.json's "
        "time_to_target_s (training and validation from the first step).",
        "- The interval is Student's t over the seeds' times. A configuration that missed the "
        "target in a seed counts as not reached and ranks after those that reached.",
        f"- A candidate stops at the best configuration's slowest seed x {settings['race_margin']:g}"
        " (autotune.race_margin, trainer.max_time): slower than that, it cannot be the best.",
        "- No loss-curve guard: a race candidate changes the curve on purpose; the target is "
        "the guard.",
    ]


def _value(value) -> str:
    if value is None:
        return "-"
    return f"{value:,}" if isinstance(value, int) else f"{value:.4g}"
