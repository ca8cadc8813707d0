"""bench/race.py's answer: a table per task and over the tasks, every miss, and AlgoPerf's
performance profile.

A contender's time to target on a task = its median steps to target on the unseen seeds (a
miss counted as infinitely many) x its seconds per step from the paired window
(race_speed.py); a search contender's = the median of its searches' picks. The performance
profile (Dolan and Moré 2002, as AlgoPerf scores) is, for each contender, the share of tasks
on which its time is within tau x the best contender's on that task.
"""

from __future__ import annotations

import math
import statistics

TAUS = (1.0, 1.5, 2.0, 3.0, 4.0)


def row_figures(row: dict, speed: dict) -> dict:
    """One recipe's figures: steps and samples to target (median and per seed), s/step, time."""
    summaries = row["summaries"]
    steps = [s.get("steps_to_target") for s in summaries]
    samples = [s.get("samples_to_target") for s in summaries]
    med_steps = statistics.median([math.inf if v is None else v for v in steps])
    med_samples = statistics.median([math.inf if v is None else v for v in samples])
    per_step = (speed.get(row["label"]) or {}).get("seconds_per_step")
    time = med_steps * per_step if per_step is not None else None
    return {
        "steps": steps,
        "samples": samples,
        "median_steps": med_steps,
        "median_samples": med_samples,
        "seconds_per_step": per_step,
        "time": time,
    }


def contender_times(result: dict) -> dict[str, dict]:
    """Per contender (its searches' median where it has several): time, steps, samples."""
    grouped: dict[str, list[dict]] = {}
    for row in result["rows"]:
        grouped.setdefault(row["contender"], []).append(row_figures(row, result["speed"]))
    found = {}
    for name, figures in grouped.items():
        times = [math.inf if f["time"] is None else f["time"] for f in figures]
        found[name] = {
            "time": statistics.median(times),
            "steps": statistics.median(f["median_steps"] for f in figures),
            "samples": statistics.median(f["median_samples"] for f in figures),
            "worst_time": max(times),
            "searches": len(figures),
        }
    return found


def profile(results: list[dict], taus=TAUS) -> dict[str, list[float]]:
    """Per contender, for each tau, the share of tasks where its time <= tau x the best."""
    per_task = [contender_times(r) for r in results]
    names = list(dict.fromkeys(n for t in per_task for n in t))
    found = {}
    for name in names:
        ratios = []
        for times in per_task:
            best = min(t["time"] for t in times.values())
            mine = times.get(name, {}).get("time", math.inf)
            ratios.append(mine / best if math.isfinite(mine) and best > 0 else math.inf)
        found[name] = [sum(r <= tau for r in ratios) / len(ratios) for tau in taus]
    return found


def fmt(value, digits: int = 0) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and not math.isfinite(value):
        return "missed"
    return f"{value:,.{digits}f}"


def _seeds(values) -> str:
    return ", ".join("missed" if v is None else f"{v:,}" for v in values)


def task_table(result: dict) -> list[str]:
    times = contender_times(result)
    default = times.get("default", {}).get("time")
    lines = [
        f"### {result['task']}",
        "",
        f"`{result['command']}`",
        "",
        "| contender | recipe | steps to target, median (seeds) | samples to target | s/step | time to target, s | x the default's time |",
        "|---|---|---|---|---:|---:|---:|",
    ]
    for row in result["rows"]:
        f = row_figures(row, result["speed"])
        ratio = None  # against a default that missed: no ratio
        if f["time"] is not None and default and math.isfinite(default):
            ratio = f["time"] / default
        lines.append(
            f"| {row['label']} | `{' '.join(row['overrides']) or '-'}` | {fmt(f['median_steps'])} "
            f"({_seeds(f['steps'])}) | {fmt(f['median_samples'])} ({_seeds(f['samples'])}) | "
            f"{fmt(f['seconds_per_step'], 4)} | {fmt(f['time'], 3)} | {fmt(ratio, 2)} |"
        )
    held = [f"- {row['label']}: {line}" for row in result["rows"] if (line := interval_held(row))]
    return [*lines, "", *[f"- {note}" for note in result["notes"]], *held, ""]


def seeds_inside(row: dict) -> list[bool]:
    """Per unseen seed, whether the search's stated interval for a new seed holds its pick's
    samples to target (a miss: outside); none where the search stated no interval."""
    interval = row.get("interval") or {}
    low, high = interval.get("low"), interval.get("high")
    if low is None or high is None:
        return []
    values = [s.get("samples_to_target") for s in row["summaries"]]
    return [v is not None and low <= v <= high for v in values]


def interval_held(row: dict) -> str | None:
    inside = seeds_inside(row)
    if not inside:
        return None
    interval, values = row["interval"], [s.get("samples_to_target") for s in row["summaries"]]
    return (
        f"stated new-seed interval [{interval['low']:,.0f}, {interval['high']:,.0f}] samples "
        f"holds {sum(inside)} of {len(inside)} unseen seeds ({_seeds(values)})"
    )


def overall_table(results: list[dict]) -> list[str]:
    per_task = {r["task"]: contender_times(r) for r in results}
    names = list(dict.fromkeys(n for t in per_task.values() for n in t))
    lines = [
        "### Over the tasks",
        "",
        "Time to target, s (steps; samples); a search contender: the median of its searches.",
        "",
        "| task | " + " | ".join(names) + " |",
        "|---|" + "---:|" * len(names),
    ]
    for task, times in per_task.items():
        cells = [
            f"{fmt(times[n]['time'], 3)} ({fmt(times[n]['steps'])}; {fmt(times[n]['samples'])})"
            if n in times
            else "-"
            for n in names
        ]
        lines.append(f"| {task} | " + " | ".join(cells) + " |")
    speedups = {
        n: [
            t["default"]["time"] / t[n]["time"]
            for t in per_task.values()
            if n in t
            and "default" in t
            and 0 < t[n]["time"] < math.inf
            and t["default"]["time"] < math.inf
        ]
        for n in names
    }
    lines.append(
        "| x faster than the default (geometric mean over the tasks both reached) | "
        + " | ".join(
            fmt(math.exp(statistics.fmean(map(math.log, v))), 2) if v else "-"
            for v in speedups.values()
        )
        + " |"
    )
    held = [inside for r in results for row in r["rows"] for inside in seeds_inside(row)]
    if held:
        lines.append(
            f"\nThe searches' stated intervals for a new seed held {sum(held)} of "
            f"{len(held)} unseen re-runs of their picks ({sum(held) / len(held):.0%})."
        )
    shares = profile(results)
    lines += [
        "",
        "Performance profile: share of tasks within tau x the best time",
        "",
        "| contender | " + " | ".join(f"tau={t:g}" for t in TAUS) + " |",
        "|---|" + "---:|" * len(TAUS),
    ]
    lines += [f"| {n} | " + " | ".join(f"{v:.2f}" for v in shares[n]) + " |" for n in names]
    return [*lines, ""]


def misses(results: list[dict], seeds) -> list[str]:
    found = []
    for result in results:
        for row in result["rows"]:
            for seed, summary in zip(seeds, row["summaries"], strict=True):
                if summary.get("steps_to_target") is None:
                    why = (
                        summary.get("error") or f"best {(summary.get('target') or {}).get('best')}"
                    )
                    found.append(f"- {result['task']}, {row['label']}, seed {seed}: missed ({why})")
    return ["### Misses", "", *(found or ["- none"]), ""]


def profile_png(results: list[dict], path) -> None:
    """The performance profile as a step plot over tau in [1, 4]."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    taus = [1 + i * 0.01 for i in range(301)]
    fig, ax = plt.subplots(figsize=(6, 4))
    styles = ["-", "--", ":", "-.", (0, (5, 1)), (0, (1, 2))]  # equal curves stay visible
    for i, (name, shares) in enumerate(profile(results, taus).items()):
        ax.step(
            taus,
            shares,
            where="post",
            label=name,
            linestyle=styles[i % len(styles)],
            linewidth=3 - 0.4 * (i % 5),
        )
    ax.set(
        xlabel="tau (time / the best time on the task)",
        ylabel="share of tasks",
        ylim=(-0.02, 1.02),
        title="bench/race.py: performance profile",
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
