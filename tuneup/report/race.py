"""The race in report.md: each configuration's time to the target over its seeds, and the runs
that did not reach it.

A run races when its summary has ``target_history`` (``target.metric`` set: plugins/target/).
Runs whose overrides differ only in ``seed`` are one configuration, a group; its row gives the
median time to target, the lowest and highest, and the mean's 95% interval, Student's t over
the seeds (``t_quantile`` of tuneup/stats/interval.py): with a few seeds it is wide, and
that is the point of showing it. A group where some seeds did not reach the target gives its
figures over those that did and says how many: the time the others would have needed is not
known, so those figures flatter the group.

With a target value the report's headline is the race's (:func:`race_headline`): the best
configuration with its time and samples to the target over its seeds, against the baseline's
configuration; not the fastest run's samples/s, which would rank by throughput and compare
seed 1's runs with seed 0's as if they were another setting. The order and the best follow
race_rank.py: time to target only where it differs beyond the noise, else steps to target;
the report says which rule placed each configuration.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from tuneup.report.comparison import CONFIDENCE, Report
from tuneup.report.runs import SEED, Run, natural_key, reproduce_command, seed_of
from tuneup.stats.interval import t_quantile


def racing(run: Run) -> bool:
    """Whether the run recorded a race: a target and the metric at each validation."""
    summary = run.summary or {}
    return isinstance(summary.get("target"), dict) and bool(summary.get("target_history"))


def target_text(target: dict) -> str:
    """``val/acc >= 0.94``; ``best val/acc`` for a run without a target value (a budget run)."""
    if target.get("value") is None:
        return f"best {target.get('metric')}"
    sign = "<=" if target.get("mode") == "min" else ">="
    return f"{target.get('metric')} {sign} {target['value']:g}"


def without_seed(overrides: list[str]) -> list[str]:
    return [o for o in overrides if o.lstrip("+~").partition("=")[0] != SEED]


@dataclass
class Group:
    """Runs of one configuration and target, differing only in their seed."""

    overrides: list[str]  # the configuration's varying overrides, seed left out
    target: str
    runs: list[Run]

    @property
    def reached(self) -> list[Run]:
        return [run for run in self.runs if _target(run).get("reached") is True]

    def figures(self, key: str) -> list[float]:
        """``key`` (``time_to_target_s``...) of the runs that reached the target."""
        values = [(run.summary or {}).get(key) for run in self.reached]
        return [float(v) for v in values if isinstance(v, int | float) and math.isfinite(v)]

    @property
    def has_value(self) -> bool:
        return any(_target(run).get("value") is not None for run in self.runs)


def seed_groups(report: Report) -> list[Group]:
    """The racing runs grouped by configuration, in job order (:func:`judge_race` ranks them)."""
    groups: dict[tuple, Group] = {}
    for run in sorted(filter(racing, report.runs), key=lambda r: natural_key(r.name)):
        overrides = without_seed(report.varying_overrides(run))
        target = target_text(_target(run))
        key = (tuple(sorted(overrides)), target)
        groups.setdefault(key, Group(overrides, target, [])).runs.append(run)
    return list(groups.values())


@dataclass
class Race:
    """A sweep's race: its configurations in report order, the best, and the blocks of
    race_rank.py that placed them (which rule decided, in words)."""

    groups: list[Group]
    best: Group | None
    blocks: list


def judge_race(report: Report) -> None:
    """With a target, the best is the configuration first by the rule of race_rank.py over
    its seeds, not the fastest run: sets ``report.race``, and ``report.best`` to the run of
    that configuration whose time to target is its median. An autotune's trials are listed,
    not judged: its answer is autotune.md."""
    from tuneup.report.race_rank import rank

    groups = seed_groups(report)
    if not any(group.has_value for group in groups):
        return
    if report.autotune:
        report.race, report.best = Race(groups, None, []), None
        return
    ordered, blocks = rank(groups)
    best = blocks[0].groups[0] if blocks else None
    report.race = Race(ordered, best, blocks)
    report.best = None
    if best is not None:
        times = sorted(best.reached, key=lambda r: r.summary.get("time_to_target_s") or 0.0)
        report.best = times[(len(times) - 1) // 2]


def race_headline(report: Report, race: Race) -> str:
    """report.md's first line for a sweep that raced to a target: the best configuration's
    time and samples to the target over its seeds, with the mean's interval, against the
    baseline's configuration, and the command that runs its seeds again."""
    from tuneup.report.cells import code

    groups, best = race.groups, race.best
    if best is None:
        targets = ", ".join(sorted({g.target for g in groups if g.has_value}))
        return f"**Best: none**: no run reached the target ({targets}); see Time to target."
    times = best.figures("time_to_target_s")
    facts = [f"{best.target} in {_seconds(statistics.median(times))}"]
    interval = t_interval(times)
    if interval is not None:
        facts[0] += (
            f" (median of {len(times)} seeds; mean {_seconds(statistics.fmean(times))}, "
            f"{CONFIDENCE:.0%} interval {_seconds(interval[0])}-{_seconds(interval[1])})"
        )
    samples = best.figures("samples_to_target")
    if samples:
        facts.append(f"{statistics.median(samples):,.0f} samples")
    reached = f"{len(best.reached)} of {len(best.runs)} seeds reached it"
    base = next((g for g in groups if report.baseline in g.runs), None)
    if base is best:
        against = "the baseline's configuration itself"
    elif base is not None and base.figures("time_to_target_s"):
        base_time = statistics.median(base.figures("time_to_target_s"))
        against = (
            f"the baseline's {code(' '.join(base.overrides) or '-')}: "
            f"{_seconds(base_time)} ({len(base.reached)} of {len(base.runs)} reached), "
            f"{statistics.median(times) / base_time:.2f}x its time"
        )
    elif base is not None:
        against = f"the baseline's {code(' '.join(base.overrides) or '-')} did not reach it"
    else:
        against = "the baseline did not race"
    seeds = sorted({seed_of(run) for run in best.runs if seed_of(run) is not None}, key=int)
    command = reproduce_command(best.runs[0], multirun_seeds=seeds)
    return (
        f"**Best: {code(' '.join(best.overrides) or '-')}**: {', '.join(facts)}; {reached}; "
        f"{against}; reproduce: {code(command)}"
    )


def t_interval(values: list[float]) -> tuple[float, float] | None:
    """The mean's interval at :data:`CONFIDENCE`, Student's t; None with fewer than two. Its
    low end stops at 0: a time is not negative (two seeds far apart reach below it)."""
    if len(values) < 2:
        return None
    mean = statistics.fmean(values)
    half = t_quantile(CONFIDENCE, len(values) - 1) * statistics.stdev(values)
    half /= math.sqrt(len(values))
    return max(0.0, mean - half), mean + half


COLUMNS = (
    "configuration",
    "target",
    "seeds",
    "reached",
    "time to target",
    "min-max",
    "mean, 95% interval",
    "train time",
    "steps",
    "samples",
)


def race_section(report: Report, figure: str | None) -> list[str]:
    """report.md's race: the time-to-target table and the runs that missed; [] without races."""
    from tuneup.report.cells import code, escape

    groups = report.race.groups if report.race is not None else seed_groups(report)
    if not groups:
        return []
    lines = [
        "## Time to target",
        "",
        "Per configuration (runs whose overrides differ only in `seed`): the median over the "
        "seeds that reached the target, their lowest and highest, and the mean with its "
        f"{CONFIDENCE:.0%} interval (Student's t over the seeds). Time: wall time from the "
        "first step to the end of the validation that reached the target; train time: the "
        "same less validations. Steps and samples: medians at that validation (their lowest and "
        "highest in brackets where the seeds differ).",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|---|---|---:|---:|" + "---:|" * (len(COLUMNS) - 4),
    ]
    for group in groups:
        times = group.figures("time_to_target_s")
        interval = t_interval(times)
        reached = f"{len(group.reached)} of {len(group.runs)}" if group.has_value else "-"
        cells = [
            code(" ".join(group.overrides) or "-"),
            escape(group.target),
            str(len(group.runs)),
            reached,
            _median(times, _seconds),
            f"{_seconds(min(times))}-{_seconds(max(times))}" if times else "-",
            (
                f"{_seconds(statistics.fmean(times))} ({_seconds(interval[0])}-{_seconds(interval[1])})"
                if interval
                else "-"
            ),
            _median(group.figures("time_to_target_train_s"), _seconds),
            _spread(group.figures("steps_to_target")),
            _spread(group.figures("samples_to_target")),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", *order_lines(report), "", *_missed(report, groups)]
    if figure:
        lines += [
            "",
            f"Each run's validation metric against wall time and samples seen, the target "
            f"dashed: [{figure}]({figure})",
            "",
            f"![race]({figure})",
        ]
    return lines


def _missed(report: Report, groups: list[Group]) -> list[str]:
    from tuneup.report.cells import code

    missed = [r for g in groups if g.has_value for r in g.runs if r not in g.reached]
    if not missed:
        return ["Every racing run reached its target."]
    lines = ["Did not reach the target:"]
    for run in sorted(missed, key=lambda r: natural_key(r.name)):
        target = _target(run)
        best = target.get("best")
        best_text = "no validation" if best is None else f"best {target.get('metric')} {best:.4g}"
        if best is not None and target.get("best_step") is not None:
            best_text += f" at step {target['best_step']}"
        status = "" if run.ok else f"; {run.status}"
        overrides = " ".join(report.varying_overrides(run)) or "-"
        lines.append(f"- run {run.name} {code(overrides)}: {best_text}{status}")
    return lines


def order_lines(report: Report) -> list[str]:
    """How the rows are ordered and which rule placed each configuration (race_rank.py)."""
    if report.race is None:
        return ["Order: job order (no target value: nothing to rank by)."]
    if report.autotune:
        return [
            "Order: job order. These are the autotune's trials, listed, not ranked: its "
            "answer is [autotune.md](autotune.md)."
        ]
    lines = [
        "Order: configurations whose seeds all reached the target first (then those where "
        "fewer did, then those that never did); among them, by median time to target only "
        f"where the time ratio's {CONFIDENCE:.0%} interval excludes 1.0 (paired by seed where "
        "both ran the same seeds, else Welch's t over the seeds; one seed on a side: no "
        "interval), else by median steps to target. Ranked here by:"
    ]
    return lines + [f"- {block.decided}: {block.why}" for block in report.race.blocks]


def _spread(values: list[float]) -> str:
    """The median, with the lowest and highest where they differ: ``20 (20-30)``."""
    if not values:
        return "-"
    text = f"{statistics.median(values):,.0f}"
    low, high = min(values), max(values)
    return text if low == high else f"{text} ({low:,.0f}-{high:,.0f})"


def _target(run: Run) -> dict:
    return (run.summary or {}).get("target") or {}


def _median(values: list[float], fmt) -> str:
    return fmt(statistics.median(values)) if values else "-"


def _seconds(value: float) -> str:
    return f"{value:,.1f} s" if abs(value) >= 10 else f"{value:.2f} s"
