"""``bench/autotune_workers.py --remeasure``: the picks of its sweeps and their command timed
in one window (bench/race_speed.py, interleaved rounds), so that the two arms' picks compare
paired: a pick's time to target = its steps to target (exact counts, from its sweep's
autotune.json) x its seconds per step in that window."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import autotune_sweep as sw
import race_speed

_s, _s3 = sw.one_decimal, sw.seconds


def remeasure(folder: Path, rounds: int, steps: int) -> dict:
    """``folder``: an autotune_workers.json. The picks of its sweeps and their command timed in one window; each pick's
    time to target = its ``pick.steps`` x its seconds per step there. Kept in the JSON."""
    path = Path(folder)
    data = json.loads(path.read_text())
    one, many = data["arms"]
    command = sw.training_command([r["command"] for r in data["results"]])
    recipes, chosen = sw.pick_recipes(data["results"])
    with tempfile.TemporaryDirectory() as window:
        timed = race_speed.measure(command, recipes, Path(window), rounds, steps)
    picks = []
    for found in data["results"]:
        name = chosen.get((found["seed"], found["arm"]))
        if name is None:
            continue
        per_step, count = timed[name]["seconds_per_step"], found["pick"]["steps"]
        time = None if per_step is None or count is None else count * per_step
        picks.append({"arm": found["arm"], "seed": found["seed"], "recipe": name,
                      "steps": count, "seconds_per_step": per_step, "time_s": time})  # fmt: skip
    data["remeasured"] = {
        "rounds": rounds,
        "steps": steps,
        "command": command,
        "steps_field": "pick.steps: the median of autotune.json's confirmed row's "
        "steps_to_target over its confirmation's seeds",
        "recipes": {n: {"overrides": recipes[n], **timed[n]} for n in recipes},
        "picks": picks,
        **paired_goal(picks, one, many),
    }
    path.write_text(json.dumps(data, indent=1))
    return data


def paired_goal(picks: list[dict], one: str, many: str) -> dict:
    """Each arm's median time to target over the seeds where both arms' picks were timed, and
    issue 48's goal on them: ``many``'s median no worse than ``one``'s."""
    times = {(p["seed"], p["arm"]): p["time_s"] for p in picks}
    seeds = sorted({s for s, _ in times if all(times.get((s, a)) is not None for a in (one, many))})
    medians = {arm: sw.median(times[(s, arm)] for s in seeds) for arm in (one, many)}
    if not seeds:
        verdict = "not measured (no seed with both picks timed)"
    else:
        met = medians[many] <= medians[one]
        change = medians[many] / medians[one] - 1
        verdict = (
            f"{'met' if met else 'NOT met'} ({_s3(medians[many])} against "
            f"{_s3(medians[one])}, {change:+.3%}; medians over {len(seeds)} search(es) each, "
            "paired in one window)"
        )
    goal = f"- {many}'s pick: median time to target no worse than {one}'s: {verdict}"
    return {"seeds": seeds, "medians": medians, "goal": goal}


def remeasured_report(data: dict) -> str:
    """The remeasured picks as Markdown: one row a search, then the medians and the goal."""
    found = data["remeasured"]
    reference = found["recipes"]["command"]["seconds_per_step"]
    lines = [
        f"Task {data.get('task', 'digits')}: the picks and the command timed in one window, "
        f"{found['rounds']} interleaved rounds of {found['steps']} steps; time to target = "
        f"{found['steps_field']} x the window's seconds per step (training steps only; "
        "the search's own estimate also counts its validations).",
        "",
        "| sampler seed | arm | pick | steps to target | s/step | x command's s/step "
        "| time to target | the search's own estimate |",
        "|---:|---|---|---:|---:|---:|---:|---:|",
    ]
    estimates = {(r["seed"], r["arm"]): r.get("pick", {}).get("seconds") for r in data["results"]}
    for p in found["picks"]:
        per_step = p["seconds_per_step"]
        times = "-" if None in (per_step, reference) else f"{per_step / reference:.2f}x"
        lines.append(
            f"| {p['seed']} | {p['arm']} | {p['recipe']} | {_s(p['steps'])} | "
            f"{'-' if per_step is None else format(per_step, '.4f')} | {times} | "
            f"{_s3(p['time_s'])} | {_s3(estimates.get((p['seed'], p['arm'])))} |"
        )
    lines.append("")
    for name, recipe in found["recipes"].items():
        lines.append(f"- {name}: `{' '.join(recipe['overrides']) or 'the command'}`")
    for arm, value in found["medians"].items():
        lines.append(f"- {arm}: median time to target of its picks {_s3(value)}")
    lines += ["", "**Goal** (issue 48), paired:", "", found["goal"]]
    return "\n".join(lines)
