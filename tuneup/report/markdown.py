"""``report.md``: the best run in one line, then one table row per run."""

from __future__ import annotations

from tuneup.report.cells import MIB, code, escape
from tuneup.report.comparison import Report, best_rule
from tuneup.report.curves import learning_sections
from tuneup.report.runs import Run, reproduce_command
from tuneup.stats.interval import NOISE

COLUMNS = (
    "run",
    "overrides",
    "samples/s",
    "spread",
    "speed-up",
    "speed-up interval",
    "peak memory",
    "memory vs baseline",
    "train loss",
    "val acc",
    "status",
)
RIGHT_ALIGNED = {
    "samples/s",
    "spread",
    "speed-up",
    "speed-up interval",
    "peak memory",
    "memory vs baseline",
    "train loss",
    "val acc",
}


def render_markdown(report: Report) -> str:
    if report.autotune:  # one folder, one answer: autotune.md's (tuneup/report/trials.py)
        from tuneup.report.trials import trials_heading

        lines = [*trials_heading(report), "", _about(report)]
    else:
        lines = [
            f"# Sweep report: {report.directory.name}",
            "",
            best_line(report),
            "",
            f"Rule: {best_rule(report)}",
            "",
            _about(report),
        ]
    if report.common_overrides:
        lines += ["", f"All runs: {code(' '.join(report.common_overrides))}"]
    lines += ["", *_table(report), "", _order(report), ""]
    lines += learning_sections(report)  # curves and the race (tuneup/report/curves.py)
    if report.notes:
        lines += ["Notes:", *(f"- {note}" for note in report.notes)]
    return "\n".join(lines) + "\n"


def best_line(report: Report) -> str:
    if report.race is not None:  # a target: time to it, seeds grouped (tuneup/report/race.py)
        from tuneup.report.race import race_headline

        return race_headline(report, report.race)
    best, base = report.best, report.baseline
    if best is None:
        return "**Best: none**: no finished run qualifies (see the status column)."
    command = reproduce_command(best)
    if best is base:
        facts = f"the baseline itself, val acc {_fixed(best.val_acc, 4)}"
    else:
        facts = ", ".join(
            fact
            for fact in (
                _fact(report.speed_up(best), "the baseline's samples/s"),
                _fact(report.memory_ratio(best), "its peak memory"),
                f"val acc {_fixed(best.val_acc, 4)} against {_fixed(base.val_acc, 4)}",
            )
            if fact
        )
    interval = report.speed_up_interval(best)
    if interval is not None and interval.verdict == NOISE:
        facts += (
            f" (within noise: its interval {interval.low:.3g}-{interval.high:.3g}x includes 1.0, "
            "so it is no demonstrated speed-up)"
        )
    return f"**Best: run {best.name}**: {facts}; reproduce: {code(command)}"


def _fact(ratio, of: str) -> str | None:
    return None if ratio is None else f"{ratio:.2f}x {of}"


def _about(report: Report) -> str:
    runs, failed = len(report.runs), len(report.not_ok)
    again = sum(run.run_again for run in report.runs)  # an Optuna trial killed, run again
    base = report.baseline
    chosen = (
        f"report.baseline={report.settings.baseline}"
        if report.settings.baseline is not None
        else "the first run; choose another with report.baseline=<run or overrides>"
    )
    return (
        f"{runs} runs, {runs - failed - again} finished, {failed} not"
        + (f", {again} interrupted and run again" if again else "")
        + f". Baseline: run {base.name} "
        f"{code(' '.join(report.varying_overrides(base)) or '-')} ({chosen})."
    )


def _order(report: Report) -> str:
    if report.autotune:
        return "In job order: the order the autotune ran them."
    if report.settings.rank_by == "val_acc":
        return "Sorted by val acc, best first; runs that did not finish last."
    return "Sorted by samples/s, fastest first; runs that did not finish last."


def _table(report: Report) -> list[str]:
    header = "| " + " | ".join(COLUMNS) + " |"
    rule = "|" + "|".join("---:" if c in RIGHT_ALIGNED else "---" for c in COLUMNS) + "|"
    return [header, rule, *("| " + " | ".join(row(report, run)) + " |" for run in report.runs)]


def row(report: Report, run: Run) -> list[str]:
    """One table row: the cells in the order of :data:`COLUMNS`."""
    best = run is report.best or (report.race is not None and run in report.best_runs)
    marks = [m for m, on in (("baseline", run is report.baseline), ("best", best)) if on]
    name = f"{run.name} ({', '.join(marks)})" if marks else run.name
    memory = run.peak_memory_bytes
    return [
        escape(name),
        code(" ".join(report.varying_overrides(run)) or "-"),
        _fixed(run.samples_per_s, 1),
        spread(run),
        _times(report.speed_up(run)),
        interval_cell(report.speed_up_interval(run)),
        "-" if memory is None else f"{memory / MIB:,.1f} MiB",
        _times(report.memory_ratio(run)),
        _fixed(run.train_loss, 4),
        _fixed(run.val_acc, 4),
        escape(
            run.status
            if run.ok or run.status == "pruned"  # an Optuna trial its pruner stopped
            else f"{run.status}: {run.error_line or 'no error recorded'}"
        ),
    ]


def spread(run: Run) -> str:
    """The lowest and highest samples/s of the run's speed windows."""
    windows = run.windows
    return f"{min(windows):.1f}-{max(windows):.1f}" if windows else "-"


def interval_cell(interval) -> str:
    """``1.31-1.76x``, with ``within noise`` when the interval includes 1.0."""
    if interval is None:
        return "-"
    text = f"{interval.low:.2f}-{interval.high:.2f}x"
    return f"{text} within noise" if interval.verdict == NOISE else text


def _fixed(value, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _times(value) -> str:
    return "-" if value is None else f"{value:.2f}x"
