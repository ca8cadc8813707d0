"""The race in report.md: each configuration's time to the target over its seeds, and the runs
that did not reach it.

A run races when its summary has ``target_history`` (``target.metric`` set: plugins/target/).
Runs whose overrides differ only in ``seed`` are one configuration, a group; its row gives the
median time to target, the lowest and highest, and the mean's 95% interval, Student's t over
the seeds (``t_quantile`` of tuneup/autotune/interval.py): with a few seeds it is wide, and
that is the point of showing it. A group where some seeds did not reach the target gives its
figures over those that did and says how many: the time the others would have needed is not
known, so those figures flatter the group.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from tuneup.autotune.interval import t_quantile
from tuneup.report import CONFIDENCE, Report
from tuneup.report.runs import Run, natural_key

SEED = "seed"


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
    """The racing runs grouped by configuration, the fastest median time to target first;
    groups where no run reached it (or without a target value) last, in job order."""
    groups: dict[tuple, Group] = {}
    for run in sorted(filter(racing, report.runs), key=lambda r: natural_key(r.name)):
        overrides = without_seed(report.varying_overrides(run))
        target = target_text(_target(run))
        key = (tuple(sorted(overrides)), target)
        groups.setdefault(key, Group(overrides, target, [])).runs.append(run)

    def order(group: Group):
        times = group.figures("time_to_target_s")
        return (0, statistics.median(times)) if times else (1, 0.0)

    return sorted(groups.values(), key=order)  # stable: job order among equals


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
    from tuneup.report.markdown import code, escape

    groups = seed_groups(report)
    if not groups:
        return []
    lines = [
        "## Time to target",
        "",
        "Per configuration (runs whose overrides differ only in `seed`): the median over the "
        "seeds that reached the target, their lowest and highest, and the mean with its "
        f"{CONFIDENCE:.0%} interval (Student's t over the seeds). Time: wall time from the "
        "first step to the end of the validation that reached the target; train time: the "
        "same less validations. Steps and samples: medians at that validation.",
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
            _median(group.figures("steps_to_target"), lambda v: f"{v:,.0f}"),
            _median(group.figures("samples_to_target"), lambda v: f"{v:,.0f}"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", *_missed(report, groups)]
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
    from tuneup.report.markdown import code

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


def _target(run: Run) -> dict:
    return (run.summary or {}).get("target") or {}


def _median(values: list[float], fmt) -> str:
    return fmt(statistics.median(values)) if values else "-"


def _seconds(value: float) -> str:
    return f"{value:,.1f} s" if abs(value) >= 10 else f"{value:.2f} s"
