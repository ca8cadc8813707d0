"""``report.png``: samples/s against peak memory (one labelled point per run), and speed-up bars.

Drawn with matplotlib's object API (no pyplot): no global backend or figure
state, so it is safe inside Hydra callbacks and tests.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from tuneup.report.comparison import Report
from tuneup.report.runs import Run
from tuneup.stats.interval import NOISE

DPI = 100
WIDTH_IN = 14.0
MIB = 2**20
BASELINE_COLOR, BEST_COLOR, RUN_COLOR = "#d62728", "#2ca02c", "#1f77b4"
LABEL_CHARS = 48
POINT_LABEL_CHARS = 28


def figure_size_px(n_runs: int) -> tuple[int, int]:
    """Width and height of report.png: fixed width, taller with many runs so bars stay legible."""
    return int(WIDTH_IN * DPI), int(_height_in(n_runs) * DPI)


def draw_figure(report: Report, path: Path) -> Path:
    figure = Figure(figsize=(WIDTH_IN, _height_in(len(report.runs))), dpi=DPI)
    FigureCanvasAgg(figure)
    speed, bars = figure.subplots(1, 2, gridspec_kw={"width_ratios": [1.15, 1]})
    _draw_speed_memory(report, speed)
    _draw_speed_up(report, bars)
    finished = len(report.runs) - len(report.not_ok)
    figure.suptitle(
        f"{report.directory.name}: {finished} of {len(report.runs)} runs finished, "
        f"baseline run {report.baseline.name}",
        fontsize=13,
    )
    figure.tight_layout()
    figure.savefig(path, dpi=DPI)
    return path


def label(report: Report, run: Run) -> str:
    """``<run>: <what sets it apart>``, shortened: a choice by its value (``bf16``), a number as
    ``<last key part>=<3 digits>`` (``lr=0.0123``)."""
    parts = [_short(o) for o in report.varying_overrides(run)]
    text = f"{run.name}: {' '.join(parts)}" if parts else run.name
    return text if len(text) <= LABEL_CHARS else text[: LABEL_CHARS - 3] + "..."


def _draw_speed_memory(report: Report, axes) -> None:
    plotted = [r for r in report.runs if r.samples_per_s is not None and r.peak_memory_bytes]
    points = [(run, run.peak_memory_bytes / MIB, run.samples_per_s) for run in plotted]
    for run, x, y in points:
        is_base, is_best = run is report.baseline, run is report.best
        axes.scatter(
            [x],
            [y],
            s=160 if is_base or is_best else 70,
            marker="*" if is_base else "o",
            color=_color(report, run),
            zorder=3,
            edgecolors="black",
            linewidths=0.6,
        )
    axes.margins(x=0.3, y=0.15)
    axes.autoscale_view()
    labels = [_point_label(report, run) for run, _, _ in points]
    for (_, x, y), text, (dx, dy) in zip(
        points, labels, _label_offsets(axes, points, labels), strict=True
    ):
        axes.annotate(
            text,
            (x, y),
            xytext=(dx, dy),
            textcoords="offset points",
            ha="right" if dx < 0 else "left",
            fontsize=8,
        )
    axes.set_xlabel("peak memory (MiB)   <- less is better")
    axes.set_ylabel("samples/s   more is better ->")
    axes.set_title("Speed against memory (red star: baseline, green: best)")
    axes.grid(True, alpha=0.3)
    missing = len(report.runs) - len(plotted)
    if missing:
        axes.text(
            0.01,
            0.01,
            f"{missing} run(s) without figures not shown (see report.md)",
            transform=axes.transAxes,
            fontsize=8,
            color="gray",
        )


def _point_label(report: Report, run: Run) -> str:
    """The run's label, or only its name where that is long (the bars carry the long one)."""
    text = label(report, run)
    text = text if len(text) <= POINT_LABEL_CHARS else run.name
    for role, is_it in (("baseline", run is report.baseline), ("best", run is report.best)):
        if is_it and role not in text:
            text += f" ({role})"
    return text


def _label_offsets(axes, points, labels) -> list[tuple[float, float]]:
    """Offsets in points for the labels: beside their point, pointing inwards (so they stay in
    the axes), moved down past labels placed before them (placed top to bottom)."""
    middle = sum(axes.get_xlim()) / 2
    to_points = 72 / axes.figure.dpi
    placed: list[tuple[float, float, float]] = []  # left, right, baseline height, in points
    offsets: dict[int, tuple[float, float]] = {}
    order = sorted(range(len(points)), key=lambda i: -points[i][2])
    for i in order:
        _, x, y = points[i]
        px, py = (value * to_points for value in axes.transData.transform((x, y)))
        width = len(labels[i]) * 4.7  # about one character at font size 8
        dx = -8.0 if x > middle else 8.0
        left, right = (px + dx - width, px + dx) if dx < 0 else (px + dx, px + dx + width)
        dy = 6.0
        while any(a < right and left < b and abs(py + dy - h) < 10 for a, b, h in placed):
            dy -= 11.0
        placed.append((left, right, py + dy))
        offsets[i] = (dx, dy)
    return [offsets[i] for i in range(len(points))]


def _draw_speed_up(report: Report, axes) -> None:
    runs = report.runs[::-1]  # barh draws bottom-up: the table's first row on top
    values = [report.speed_up(run) for run in runs]
    colors = [_color(report, run) for run in runs]
    positions = range(len(runs))
    intervals = [report.speed_up_interval(run) for run in runs]
    axes.barh(positions, [v or 0.0 for v in values], color=colors, height=0.6)
    for position, value, interval in zip(positions, values, intervals, strict=True):
        if interval is not None and value is not None:  # the interval around the bar's end
            axes.errorbar(
                value,
                position,
                xerr=[[max(0.0, value - interval.low)], [max(0.0, interval.high - value)]],
                color="black",
                capsize=3,
                linewidth=1,
            )
    axes.set_yticks(list(positions), [label(report, run) for run in runs], fontsize=8)
    axes.axvline(1.0, color="black", linewidth=0.8, linestyle="--")
    for position, run, value, interval in zip(positions, runs, values, intervals, strict=True):
        acc = "" if run.val_acc is None else f"  acc {run.val_acc:.3f}"
        noise = " (within noise)" if interval is not None and interval.verdict == NOISE else ""
        text = f" {value:.2f}x{noise}{acc}" if value is not None else f" {run.status}"
        end = max(value or 0.0, interval.high if interval is not None else 0.0)
        axes.text(end, position, text, va="center", fontsize=8)
    top = max([v for v in values if v is not None] + [i.high for i in intervals if i], default=1.0)
    axes.set_xlim(0, max(1.0, top) * 1.35)
    axes.set_xlabel("speed-up over the baseline (samples/s ratio; whiskers: 95% interval)")
    axes.set_title("Speed-up (dashed line: baseline)")
    axes.grid(True, axis="x", alpha=0.3)


def _color(report: Report, run: Run) -> str:
    return (
        BASELINE_COLOR
        if run is report.baseline
        else BEST_COLOR
        if run is report.best
        else RUN_COLOR
    )


def _short(override: str) -> str:
    key, _, value = override.lstrip("+~").partition("=")
    if re.fullmatch(r"[A-Za-z_][\w-]*", value):
        return value
    return f"{key.rsplit('.', 1)[-1]}={_round_numbers(value)}"


def _round_numbers(value: str) -> str:
    def shorten(match: re.Match) -> str:
        number = float(match.group())
        return match.group() if number == 0 or not math.isfinite(number) else f"{number:.3g}"

    return re.sub(r"-?\d+\.\d+(?:[eE][-+]?\d+)?|-?\d+[eE][-+]?\d+", shorten, value)


def _height_in(n_runs: int) -> float:
    return max(6.0, 2.0 + 0.32 * n_runs)
