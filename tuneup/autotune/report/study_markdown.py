"""autotune.md of the time-to-target study, drawn from its record (report/study_record.py)."""

from __future__ import annotations

from pathlib import Path

from tuneup.autotune.report.stages_markdown import stages_lines
from tuneup.report.cells import code, escape


def render_study_markdown(record: dict, sweep_dir: Path) -> str:
    target, settings = record["target"], record["settings"]
    unit = record["cost"]["unit"]
    found = " ".join(record["recipe"]["found"]) or "your command as it is"
    pct = f"{settings['confidence']:.0%}"
    lines = [
        f"# Autotune (time to target): {Path(sweep_dir).name}",
        "",
        f"On {record['device']}: {record['elapsed_seconds'] / 60:.1f} min of a "
        f"{settings['budget_minutes']:g}-minute budget, {len(record['trials'])} runs; target "
        f"{target['metric']} {'>=' if target['mode'] == 'max' else '<='} {target['value']}; "
        f"study seed {record['seeds']['explore']}, paired seeds "
        f"{_seed_range(record['seeds']['confirm'])} (the first {settings['seeds']} for every "
        "configuration, then one at a time while undecided), held-out seed "
        f"{record['seeds']['held_out']}.",
        "",
        f"**Recipe: {code(found)}**: {escape(record['verdict'])}.",
        "",
        *stages_lines(record),
        f"Ranked by `autotune.cost={record['cost']['name']}`: {escape(record['cost']['why'])}.",
        "",
        *_expected(record["recipe"], pct),
        f"Run it: `{record['recipe']['command']}` (the preset is `{record['recipe']['file']}`).",
        "",
        f"The study: `{record['study']['open']}`.",
        "",
        "## Confirmed on paired seeds",
        "",
        f"Mean [{pct} interval] over the seeds, in `autotune.cost={settings['cost']}`'s "
        f"units ({unit}). The verdict is the corrected one: one-sided t on the per-seed "
        "differences (their spread at least the validation lattice's and the seeds' pooled "
        "spread), corrected for the seeds added one at a time and, by Holm's step-down, for the "
        "configurations compared (p: the corrected p-value, accepted at "
        f"{(1 - settings['confidence']) / 2:g} or below). Estimated time = steps x seconds per "
        "step (paired throughput windows) + validations; measured time: the runs' own clock.",
        "",
        f"| configuration | seeds | cost to target ({unit}) | per seed | steps | samples "
        "| vs baseline (difference) | verdict | held-out seed | estimated time (s) "
        "| measured time (s) |",
        "|---|---:|---:|---|---|---|---:|---|---:|---:|---:|",
    ]
    for row in record["confirmed"]:
        decision = row["decision"] or {}
        per_seed = ", ".join(_number(c, unit) for c in row["cost"])
        budget = row.get("samples_budget")
        missed = None in row["samples_to_target"]
        per_seed += f" (budget {budget:,} samples)" if budget and missed else ""
        lines.append(
            f"| {code(row['label'])} | {len(row['cost'])} | "
            f"{_interval(row['cost_interval'], _spec(unit))} | "
            f"{per_seed} | {_counts(row['steps_to_target'], 'missed')} | "
            f"{_counts(row['samples_to_target'], 'missed')} | "
            f"{_interval(decision.get('interval'), '+' + _spec(unit)) if decision else '-'} | "
            f"{_verdict(decision)} | {_held_out_cell(row.get('held_out'))} | "
            f"{_estimated(row['estimated_time'])} | "
            f"{_interval(row['measured_time_interval'], '.3g')} |"
        )
    if record["speed"]:
        s = record["speed"]
        source = (
            f"{s['rounds']} interleaved rounds"
            if s.get("source", "rounds") == "rounds"
            else f"the {s['rounds']} paired seeds' runs: no interleaved round fit in the budget"
        )
        lines += [
            "",
            f"Speed ({source}): seconds per step, pick / "
            f"baseline {_interval(s['seconds_per_step_ratio'], '.3g')}; steps, pick / "
            f"baseline {_interval(s['steps_ratio'], '.3g')}; samples, pick / baseline "
            f"{_interval(s['samples_ratio'], '.3g')}; estimated time to target, pick / "
            f"baseline {_interval(s['time_ratio'], '.3g')}: {s['time_verdict']} "
            "(the steps on the paired seeds and the seconds per step of the speed pairs, "
            "combined on the log scale).",
        ]
    lines += [
        "",
        "## The study",
        "",
        f"| trial | job | configuration | state | cost to target "
        f"({unit}) | steps | samples | pruned at (samples) |",
        "|---:|---:|---|---|---:|---:|---:|---:|",
    ]
    for t in record["explore"]:
        what = "your command (not run again)" if t["baseline"] else " ".join(t["overrides"] or [])
        state = t["state"].lower() + (
            f": never launched: {t['never_launched']}" if t["never_launched"] else ""
        )
        value = (
            _number(t["value"], unit)
            if t["reached"] or t["baseline"]
            else ("not reached" if t["reached"] is False else "-")
        )
        steps = t.get("steps") or (record["baseline"].get("steps") if t["baseline"] else None)
        samples = t["samples_seen"] or (
            record["baseline"].get("samples") if t["baseline"] else None
        )
        lines.append(
            f"| {t['number']} | {t['job'] or '-'} | {code(what)} | {escape(state)} | "
            f"{value} | {_counts([steps])} | {_counts([samples])} | "
            f"{t['pruned_at_samples'] or '-'} |"
        )
    lines += _space_lines(record["space"])
    if record["notes"]:
        lines += ["", "## Notes", "", *(f"- {escape(n)}" for n in record["notes"])]
    lines += [
        "",
        "![every configuration: the target metric against samples and time](autotune.png)",
        "",
    ]
    return "\n".join(lines)


def _expected(recipe: dict, pct: str) -> list[str]:
    """What the recipe is expected to need: its run on the held-out seed; the paired seeds'
    mean is the decision's evidence, labelled so."""
    lines = []
    held = recipe.get("expected")
    if held:
        missed = "" if held["reached"] else " (missed the target: what it ran)"
        time_s = held["time_to_target_s"]
        lines += [
            f"Expected to the target (its run on the held-out seed {held['seed']}, which "
            f"neither chose it nor accepted it){missed}: {held['samples_to_target']:,} "
            f"samples, {held['steps_to_target']:,} steps, "
            f"{'-' if time_s is None else format(time_s, '.3g')} s.",
            "",
        ]
    lines += [
        f"Its samples to target on the paired seeds (the decision's evidence): mean "
        f"{_interval(recipe['samples_to_target_paired'], ',.0f')} ({pct} interval of the "
        f"mean); on a new seed {_interval(recipe['samples_to_target_next_seed'], ',.0f')} "
        f"({pct} prediction interval on the log scale, the seeds' spread pooled over the "
        "configurations confirmed: where a re-run on a seed the search never saw should "
        "land).",
        "",
    ]
    return lines


def _verdict(decision: dict) -> str:
    if not decision:
        return "reference"
    text = decision["verdict"]
    if decision.get("corrected"):
        text += f" ({decision['corrected']} before the correction)"
    if decision.get("p_adjusted") is not None:
        text += f", p {decision['p_adjusted']:.2g}"
    return text


def _held_out_cell(held: dict | None) -> str:
    if not held:
        return "-"
    value = f"{held['samples_to_target']:,}"
    return f"{value} (seed {held['seed']})" if held["reached"] else f"missed at {value}"


def _seed_range(seeds: list[int]) -> str:
    if not seeds:
        return "none run"
    return f"{seeds[0]}-{seeds[-1]}" if len(seeds) > 2 else ", ".join(map(str, seeds))


def _spec(unit: str) -> str:
    return ".3g" if unit == "s" else ",.0f"


def _number(value, unit: str) -> str:
    return "-" if value is None else format(value, _spec(unit))


def _counts(values: list, none: str = "-") -> str:
    return ", ".join(none if v is None else f"{v:,}" for v in values)


def _space_lines(space: dict) -> list[str]:
    """The space the study searched (key, distribution, where it is sampled), and each choice
    left out of it with the check's reason."""
    lines = ["", "## Searched space", "", "| key | distribution | condition |", "|---|---|---|"]
    lines += [
        f"| {code(r['key'])} | {escape(r['distribution'])} | {escape(r['condition'])} |"
        for r in space["searched"]
    ]
    if space["left_out"]:
        lines += ["", "## Left out", ""]
        lines += [f"- {code(n['override'])}: {escape(n['reason'])}" for n in space["left_out"]]
    return lines


def _estimated(found: dict | None) -> str:
    """An estimated time; at least it where a seed missed (counted at the samples it ran)."""
    text = _interval(found, ".3g")
    return f">= {text}" if found and found.get("at_least") else text


def _interval(found: dict | None, spec: str) -> str:
    if not found or found.get("estimate") is None:
        return "-"
    text = format(found["estimate"], spec)
    if found.get("low") is None or found.get("high") is None:
        return text
    return f"{text} [{format(found['low'], spec)}, {format(found['high'], spec)}]"
