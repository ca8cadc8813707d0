"""autotune.json and autotune.md of the time-to-target study (study_search.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from tuneup.autotune import paired
from tuneup.autotune.outcome import BASELINE
from tuneup.autotune.race import reached
from tuneup.autotune.record import trial_dict
from tuneup.autotune.study_space import searched
from tuneup.report.markdown import code, escape


def build_study_record(search, command: list[str], recipe: dict) -> dict:
    confidence = search.settings.confidence
    confirmed = []
    hits = {name: [t.figure("samples_to_target") for t in e["trials"] if reached(t)]
            for name, e in search.confirmed.items()}  # fmt: skip
    spread = paired.pooled_spread([v for v in hits.values() if len(v) == len(search.confirm_seeds)])
    for name, entry in search.confirmed.items():
        runs = entry["trials"]
        samples = [t.figure("samples_to_target") if reached(t) else None for t in runs]
        times = [t.figure("time_to_target_s") for t in runs if reached(t)]
        row = {
            "label": name, "overrides": list(entry["overrides"]), "study_trial": entry["trial"],
            "jobs": [t.job for t in runs], "reached": all(reached(t) for t in runs),
            "samples_to_target": samples,
            "samples_prediction": paired.prediction_interval(
                hits[name], confidence, floor=0.0, spread=spread
            ),
            "samples_interval": paired.mean_interval([s for s in samples if s is not None],
                                                     confidence, floor=0.0),
            "measured_time_s": times,
            "measured_time_interval": paired.mean_interval(times, confidence, floor=0.0),
            "decision": entry.get("decision"), "estimated_time": None,
            "samples_budget": entry.get("samples_budget"),
        }  # fmt: skip
        confirmed.append(row)
    speed = None
    if search.speed is not None:
        s = search.speed
        speed = {"rounds": len(s.pairs), "pairs": s.pairs, "jobs": [t.job for t in s.trials],
                 "seconds_per_sample_ratio": s.ratio(), "samples_ratio": s.samples_ratio(),
                 "time_ratio": s.time_ratio(), "time_verdict": s.time_verdict()}  # fmt: skip
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
        "elapsed_seconds": search.budget.elapsed,
        "seeds": {"explore": search.seed, "confirm": search.confirm_seeds},
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
            "samples_to_target": mine.get("samples_interval"),
            "samples_to_target_next_seed": mine.get("samples_prediction"),
        },
        "trials": [{**trial_dict(t), **_curve(t)} for t in search.lab.trials],
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
    return {"number": trial.number, "state": trial.state.name, "value": trial.value,
            "params": trial.params, "overrides": attrs.get("tuneup_overrides"),
            "job": attrs.get("tuneup_job"), "baseline": bool(attrs.get("tuneup_baseline")),
            "reached": attrs.get("reached"), "pruned_at_samples": attrs.get("pruned_at_samples"),
            "samples_seen": attrs.get("samples_seen"),
            "never_launched": attrs.get("tuneup_never_launched"), "error": attrs.get("error"),
            "curve": curve}  # fmt: skip


def _curve(trial) -> dict:
    history = trial.figure("target_history") or []
    return {
        "reached": (trial.figure("target") or {}).get("reached"),
        "samples_to_target": trial.figure("samples_to_target"),
        "time_to_target_s": trial.figure("time_to_target_s"),
        "curve": {"samples": [e["samples"] for e in history], "time_s": [e["time_s"] for e in history],
                  "value": [e["value"] for e in history]},
    }  # fmt: skip


def render_study_markdown(record: dict, sweep_dir: Path) -> str:
    target, settings = record["target"], record["settings"]
    found = " ".join(record["recipe"]["found"]) or "your command as it is"
    pct = f"{settings['confidence']:.0%}"
    lines = [
        f"# Autotune (time to target): {Path(sweep_dir).name}",
        "",
        f"On {record['device']}: {record['elapsed_seconds'] / 60:.1f} min of a "
        f"{settings['budget_minutes']:g}-minute budget, {len(record['trials'])} runs; target "
        f"{target['metric']} {'>=' if target['mode'] == 'max' else '<='} {target['value']}; "
        f"study seed {record['seeds']['explore']}, paired seeds "
        f"{', '.join(map(str, record['seeds']['confirm']))}.",
        "",
        f"**Recipe: {code(found)}**: {escape(record['verdict'])}.",
        "",
        f"Its samples to target: mean {_interval(record['recipe']['samples_to_target'], ',.0f')}"
        f" over the paired seeds ({pct} interval of the mean); on a new seed "
        f"{_interval(record['recipe']['samples_to_target_next_seed'], ',.0f')} ({pct} "
        "prediction interval: where a re-run on a seed the search never saw should land).",
        "",
        f"Run it: `{record['recipe']['command']}` (the preset is `{record['recipe']['file']}`).",
        "",
        f"The study: `{record['study']['open']}`.",
        "",
        "## Confirmed on paired seeds",
        "",
        f"Mean [{pct} interval] over the seeds. Estimated time = samples x seconds per sample "
        "(paired throughput windows) + validations; measured time: the runs' own clock.",
        "",
        "| configuration | samples to target | per seed | vs baseline (difference) | verdict "
        "| estimated time (s) | measured time (s) |",
        "|---|---:|---|---:|---|---:|---:|",
    ]
    for row in record["confirmed"]:
        decision = row["decision"] or {}
        per_seed = ", ".join("missed" if s is None else f"{s:,}" for s in row["samples_to_target"])
        budget = row.get("samples_budget")
        per_seed += f" (budget {budget:,})" if budget and None in row["samples_to_target"] else ""
        lines.append(
            f"| {code(row['label'])} | {_interval(row['samples_interval'], ',.0f')} | {per_seed} | "
            f"{_interval(decision.get('interval'), '+,.0f') if decision else '-'} | "
            f"{decision.get('verdict', 'reference')} | "
            f"{_estimated(row['estimated_time'])} | "
            f"{_interval(row['measured_time_interval'], '.3g')} |"
        )
    if record["speed"]:
        s = record["speed"]
        lines += ["", f"Speed ({s['rounds']} interleaved rounds): seconds per sample, pick / "
                  f"baseline {_interval(s['seconds_per_sample_ratio'], '.3g')}; samples, pick / "
                  f"baseline {_interval(s['samples_ratio'], '.3g')}; estimated time to target, "
                  f"pick / baseline {_interval(s['time_ratio'], '.3g')}: {s['time_verdict']}."]  # fmt: skip
    lines += ["", "## The study", "", "| trial | job | configuration | state | samples to target "
              "| pruned at (samples) |", "|---:|---:|---|---|---:|---:|"]  # fmt: skip
    for t in record["explore"]:
        what = "your command (not run again)" if t["baseline"] else " ".join(t["overrides"] or [])
        state = t["state"].lower() + (f": never launched: {t['never_launched']}"
                                      if t["never_launched"] else "")  # fmt: skip
        value = f"{t['value']:,.0f}" if t["reached"] and t["value"] is not None else (
            "not reached" if t["reached"] is False else "-")  # fmt: skip
        if t["baseline"]:
            value = f"{t['value']:,.0f}"
        lines.append(f"| {t['number']} | {t['job'] or '-'} | {code(what)} | {escape(state)} | "
                     f"{value} | {t['pruned_at_samples'] or '-'} |")  # fmt: skip
    lines += _space_lines(record["space"])
    if record["notes"]:
        lines += ["", "## Notes", "", *(f"- {escape(n)}" for n in record["notes"])]
    lines += ["", "![every configuration: the target metric against samples and time]"
              "(autotune.png)", ""]  # fmt: skip
    return "\n".join(lines)


def _space_lines(space: dict) -> list[str]:
    """The space the study searched (key, distribution, where it is sampled), and each choice
    left out of it with the check's reason."""
    lines = ["", "## Searched space", "", "| key | distribution | condition |", "|---|---|---|"]
    lines += [f"| {code(r['key'])} | {escape(r['distribution'])} | {escape(r['condition'])} |"
              for r in space["searched"]]  # fmt: skip
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
