"""bench/race.py's verdicts: autotune's median pick against each other contender, with the
timing's noise, and the race's goals (issue 50), each checked on the figures.

A time to target is a count (the median steps on the unseen seeds, exact whatever the load)
times a measured figure (seconds per step, from the task's paired window: race_speed.py).
Two picks' times are compared as the ratio of their steps times the ratio of their seconds
per step over the window's rounds (Student's t over the rounds' paired log ratios, as the
throughput decisions take it), so a difference smaller than the window resolves reads "level
within the timing's noise", not a win or a loss. The interval covers the timing only: the
median steps of three seeds are taken as they are. The searches' own spread (each contender
searches three times) is :func:`searches_apart`'s: a permutation test over the searches.
"""

from __future__ import annotations

import itertools
import math
import statistics

from race_report import contender_times, fmt, row_figures, seeds_inside

from tuneup.stats.interval import paired

SEARCHES = ("autotune", "autotune_steps")
FASTER, SLOWER, LEVEL = (
    "faster beyond the timing's noise",
    "slower beyond the timing's noise",
    "level within the timing's noise",
)


def median_row(result: dict, contender: str) -> dict | None:
    """The row of ``contender`` whose time is its searches' median (the one the race scores);
    None when the median falls between two rows (an even number of searches) or none ran."""
    rows = [row for row in result["rows"] if row["contender"] == contender]
    times = [math.inf if t is None else t for t in _pick_times(result, contender)]
    if not rows:
        return None
    middle = statistics.median(times)
    return next((row for row, t in zip(rows, times, strict=True) if t == middle), None)


def time_ratio(result: dict, mine: str, other: str, confidence: float = 0.95) -> dict | None:
    """``mine``'s median pick's time to target over ``other``'s: ``estimate``, ``low``,
    ``high`` and ``verdict``. None when either missed the target, or their seconds per step
    were not timed in one window (a contender merged from another run: ``window``)."""
    a, b = median_row(result, mine), median_row(result, other)
    if a is None or b is None:
        return None
    fa, fb = row_figures(a, result["speed"]), row_figures(b, result["speed"])
    if fa["time"] is None or fb["time"] is None or math.inf in (fa["time"], fb["time"]):
        return None
    sa, sb = result["speed"][a["label"]], result["speed"][b["label"]]
    if sa.get("window") != sb.get("window") or len(sa["speeds"]) != len(sb["speeds"]):
        return None
    speed = paired(sb["speeds"], sa["speeds"], confidence)  # a's samples/s over b's
    if speed is None:
        return None
    scale = fa["median_steps"] / fb["median_steps"] * sa["batch"] / sb["batch"]
    low = scale / speed.high if speed.high else 0.0
    high = scale / speed.low if speed.low else math.inf
    verdict = FASTER if high < 1 else SLOWER if low > 1 else LEVEL
    return {"estimate": scale / speed.estimate, "low": low, "high": high, "verdict": verdict}


def _steps(result: dict, contender: str) -> float | None:
    row = median_row(result, contender)
    return row_figures(row, result["speed"])["median_steps"] if row else None


def _apart(times: dict, mine: str, other: str) -> str:
    """Why two contenders' times have no ratio."""
    if math.isinf(times[other]["time"]):
        return f"{other} missed the target"
    if math.isinf(times[mine]["time"]):
        return f"{mine} missed the target"
    return "timed in other windows, not paired"


def _why(result: dict, times: dict, mine: str, other: str) -> str:
    for name in (mine, other):
        if median_row(result, name) is None:
            return f"{name}: no single median pick (an even number of searches)"
    return _apart(times, mine, other)


def _ratio(ratio: dict) -> str:
    return f"{ratio['estimate']:.2f} [{ratio['low']:.2f}, {fmt(ratio['high'], 2)}]"


def against_table(results: list[dict], mine: str = "autotune") -> list[str]:
    """Per task, ``mine``'s median pick against every other contender timed in its window."""
    lines = [
        f"### {mine}'s median pick against each contender's",
        "",
        "Time to target, the pick's over the contender's (a search contender: its median"
        " search's pick): steps (median over the unseen seeds) x seconds per step, the latter's"
        " 95 % interval over the window's paired rounds.",
        "",
        "| task | contender | steps (pick; contender) | time ratio [95 % interval] | verdict |",
        "|---|---|---:|---:|---|",
    ]
    found = False
    for result in results:
        times = contender_times(result)
        if mine not in times:
            continue
        for other in times:
            if other in (mine, *SEARCHES):
                continue
            ratio = time_ratio(result, mine, other)
            cell = (
                f"{_ratio(ratio)} | {ratio['verdict']}"
                if ratio
                else f"- | {_why(result, times, mine, other)}"
            )
            steps = "; ".join(fmt(_steps(result, name)) for name in (mine, other))
            lines.append(f"| {result['task']} | {other} | {steps} | {cell} |")
            found = True
    return [*lines, ""] if found else []


def _pick_times(result: dict, contender: str) -> list[float | None]:
    """The times to target of ``contender``'s picks, one per search (a miss: infinity; a pick
    whose seconds per step were not timed: None)."""
    return [
        row_figures(row, result["speed"])["time"]
        for row in result["rows"]
        if row["contender"] == contender
    ]


def searches_apart(result: dict, mine: str, other: str) -> dict | None:
    """Whether ``mine``'s searches are slower than ``other``'s beyond the searches' own spread:
    a permutation test over the searches (their picks dealt between the two contenders in
    every way, the two taken as alike), the one-sided p-value of ``mine``'s median pick being
    the slower by at least the race's difference. None unless both searched at least twice
    and every pick was timed."""
    a, b = _pick_times(result, mine), _pick_times(result, other)
    if len(a) < 2 or len(b) < 2 or None in a + b:
        return None
    finite = [t for t in a + b if not math.isinf(t)]
    never = 10.0 * max(finite, default=1.0) + 1.0  # a miss: slower than every hit, finitely
    pool = [never if math.isinf(t) else t for t in a + b]

    def gap(chosen: tuple[int, ...]) -> float:
        rest = [pool[i] for i in range(len(pool)) if i not in chosen]
        return statistics.median(pool[i] for i in chosen) - statistics.median(rest)

    observed = gap(tuple(range(len(a))))
    splits = math.comb(len(pool), len(a))
    tolerance = 1e-9 * max(pool)
    beyond = sum(
        gap(chosen) >= observed - tolerance
        for chosen in itertools.combinations(range(len(pool)), len(a))
    )
    return {"mine": a, "other": b, "p": beyond / splits, "splits": splits}


def searches_table(results: list[dict], mine: str = "autotune", other: str = "random") -> list[str]:
    """Per task, ``mine``'s searches against ``other``'s with the searches' own spread."""
    lines = [
        f"### {mine}'s searches against {other}'s",
        "",
        "The time ratios above hold the timing's noise, not the searches': each pick's time to"
        " target (s), and the one-sided p-value of a permutation test over the searches (the"
        " picks dealt between the two contenders in every way, the two taken as alike) that"
        f" {mine}'s median pick is the slower by at least the race's difference.",
        "",
        f"| task | {other}'s picks | {mine}'s picks | p ({mine} slower) |",
        "|---|---|---|---:|",
    ]
    found = False
    for result in results:
        apart = searches_apart(result, mine, other)
        if apart is None:
            continue
        picks = [", ".join(fmt(t, 3) for t in apart[name]) for name in ("other", "mine")]
        lines.append(f"| {result['task']} | {picks[0]} | {picks[1]} | {apart['p']:.2f} |")
        found = True
    return [*lines, ""] if found else []


def goals(results: list[dict]) -> list[str]:
    """The race's goals (issue 50), each checked on the figures of ``results``: met, not met,
    or not measured (a contender missing from the run)."""
    per_task = {r["task"]: contender_times(r) for r in results}
    by_task = {r["task"]: r for r in results}
    lines = ["### Goals", ""]

    def verdict(ok: bool | None) -> str:
        return "not measured" if ok is None else ("met" if ok else "NOT met")

    for pick, figure, unit in (("autotune", "time", "time"), ("autotune_steps", "steps", "steps")):
        worse = []
        measured = False
        for task, times in per_task.items():
            if pick not in times:
                continue
            measured = True
            result = by_task[task]
            mine = times[pick][figure]
            others = [n for n in times if n not in (pick, "autotune", "autotune_steps")]
            worse += [
                f"{task}: {n} {fmt(times[n][figure], 3)} < {fmt(mine, 3)}"
                + (_noise(result, pick, n) if figure == "time" else "")
                for n in others
                if times[n][figure] < mine
            ]
        ok = None if not measured else not worse
        lines.append(
            f"- {pick}'s median pick in no more {unit} than every other contender, on every "
            f"task: {verdict(ok)}" + (f" ({'; '.join(worse)})" if worse else "")
        )
    ratios, both_missed = [], []
    for task, t in per_task.items():
        if "autotune" not in t or "default" not in t:
            continue
        mine, default = t["autotune"]["time"], t["default"]["time"]
        if math.isinf(mine) and math.isinf(default):
            both_missed.append(task)  # no ratio: neither reached the target
        else:
            ratios.append(math.inf if math.isinf(default) else default / mine)
    if any(r == 0 or math.isinf(r) for r in ratios):
        mean = 0.0 if 0.0 in ratios else math.inf  # a pick that missed where the default reached
    else:
        mean = math.exp(statistics.fmean(map(math.log, ratios))) if ratios else None
    note = f" (neither reached the target on {', '.join(both_missed)})" if both_missed else ""
    lines.append(
        f"- autotune's median pick at least 1.5x faster than the default over the tasks "
        f"(geometric mean): {verdict(None if mean is None else mean >= 1.5)}"
        + (
            " (the default missed on a task where the pick reached)"
            if mean is not None and math.isinf(mean)
            else " (a pick missed where the default reached)"
            if mean == 0
            else f" ({fmt(mean, 2)}x)"
            if mean is not None
            else ""
        )
        + note
    )
    slower = [
        f"{task} ({fmt(t['autotune']['worst_time'], 3)} s > {fmt(t['default']['time'], 3)} s)"
        for task, t in per_task.items()
        if "autotune" in t and t["autotune"]["worst_time"] > t["default"]["time"]
    ]
    searched = any("autotune" in t for t in per_task.values())
    lines.append(
        f"- the worst of autotune's searches never slower than the default: "
        f"{verdict(None if not searched else not slower)}"
        + (f" ({'; '.join(slower)})" if slower else "")
    )
    held = [
        inside
        for r in results
        for row in r["rows"]
        if row["contender"] in SEARCHES
        for inside in seeds_inside(row)
    ]
    share = sum(held) / len(held) if held else None
    lines.append(
        f"- the picks' stated new-seed intervals hold at least 80 % of the unseen re-runs: "
        f"{verdict(None if share is None else share >= 0.8)}"
        + (f" ({sum(held)} of {len(held)}, {share:.0%})" if held else "")
    )
    return [*lines, ""]


def _noise(result: dict, mine: str, other: str) -> str:
    ratio = time_ratio(result, mine, other)
    return f" (time ratio {_ratio(ratio)}: {ratio['verdict']})" if ratio else ""
