"""autotune.png: each candidate's speed-up with its interval (the path), and every trial's speed
in launch order (the interleaving and the noise). matplotlib's object API, no pyplot state."""

from __future__ import annotations

import math
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

FIGURE_FILE = "autotune.png"
DPI = 100
COLORS = {"accepted": "#2ca02c", "rejected": "#d62728", "not tried": "#7f7f7f"}
LABEL_CHARS = 44
AXIS = (0.05, 20.0)  # speed-ups drawn; wider intervals are cut at the edges


def draw_figure(record: dict, path: Path) -> Path:
    launched = [o for o in record["path"] if o["trials"]]
    height = max(5.0, 2.0 + 0.4 * len(launched))
    figure = Figure(figsize=(15, height), dpi=DPI)
    FigureCanvasAgg(figure)
    path_axes, trial_axes = figure.subplots(1, 2, gridspec_kw={"width_ratios": [1.1, 1]})
    _draw_path(launched, path_axes)
    _draw_trials(record["trials"], trial_axes)
    found = " ".join(record["recipe"]["found"]) or "your command as it is"
    figure.suptitle(f"autotune on {record['device']}: recipe {_short(found, 80)}", fontsize=12)
    figure.tight_layout()
    figure.savefig(path, dpi=DPI)
    return path


def _draw_path(outcomes: list[dict], axes) -> None:
    rows = outcomes[::-1]  # barh-style: the first step on top
    for y, outcome in enumerate(rows):
        interval = outcome["interval"]
        color = COLORS.get(outcome["verdict"], "#1f77b4")
        if interval:
            estimate = min(max(interval["estimate"], AXIS[0]), AXIS[1])
            if interval["repeats"] > 1:  # one round has no interval: the point alone
                low = max(interval["low"], AXIS[0])
                high = min(interval["high"] or AXIS[1], AXIS[1])  # clipped to the axis
                axes.plot([low, high], [y, y], color=color, linewidth=2)
            axes.plot([estimate], [y], "o", color=color, markersize=7)
            text = f" {interval['estimate']:.3g}x {outcome['verdict']}"
            axes.annotate(
                text,
                (estimate, y),
                xytext=(0, 6),
                textcoords="offset points",
                fontsize=8,
                ha="center",
            )
    axes.set_yticks(range(len(rows)), [_short(o["label"], LABEL_CHARS) for o in rows], fontsize=8)
    axes.axvline(1.0, color="black", linestyle="--", linewidth=0.8)
    axes.set_xscale("log")
    axes.set_xlim(*AXIS)
    axes.set_xlabel("speed-up over the recipe so far (dot; line: interval, cut at the edges)")
    axes.set_title("The path: each candidate against the recipe so far")
    axes.grid(True, axis="x", alpha=0.3)
    if not rows:
        axes.text(0.5, 0.5, "no candidate was launched", transform=axes.transAxes, ha="center")


def _draw_trials(trials: list[dict], axes) -> None:
    labels = list(dict.fromkeys(t["label"] for t in trials))
    palette = [f"C{i % 10}" for i in range(len(labels))]
    for trial in trials:
        color = palette[labels.index(trial["label"])]
        job = int(trial["job"])
        windows = [w for w in trial["samples_per_s_windows"] or [] if w and math.isfinite(w)]
        if windows:
            axes.plot([job, job], [min(windows), max(windows)], color=color, alpha=0.5)
        if trial["speed"]:
            axes.plot([job], [trial["speed"]], "o", color=color, markersize=6)
        elif trial["status"] != "ok":
            axes.plot([job], [0], "x", color=color, markersize=7)
    for label, color in zip(labels, palette, strict=True):
        axes.plot([], [], "o", color=color, label=_short(label, LABEL_CHARS))
    axes.legend(fontsize=7, loc="best")
    axes.set_xlabel("job (launch order)")
    axes.set_ylabel("samples/s: fastest window (dot), all windows (line); x: failed")
    axes.set_title("Every trial: the interleaving and the noise")
    axes.grid(True, alpha=0.3)


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
