"""``curves.png`` and ``race.png``: what each run learned, beside how fast it ran (report.png).

- ``curves.png``: each run's training loss against samples seen (summary.json ``loss_curve``:
  the mean loss over buckets of micro-batches, at the samples seen by each bucket's end), and
  each run's final validation metric (val acc, else val loss), bars in the table's order. What
  an lr or batch-size sweep is read by.
- ``race.png``, where runs recorded a race (``target_history``, plugins/target/): each run's
  validation metric against wall time and against samples seen, the target dashed. Seeds of
  one configuration share a colour.

matplotlib is imported when drawing, so report.md (which links these) is written without it.
"""

from __future__ import annotations

from pathlib import Path

from tuneup.report.comparison import Report
from tuneup.report.race import racing, seed_groups, without_seed
from tuneup.report.runs import Run

CURVES_FILE, RACE_FILE = "curves.png", "race.png"
DPI, WIDTH_IN, HEIGHT_IN = 100, 14.0, 5.5
LEGEND_RUNS = 16  # more runs than this: no legend (the colours repeat anyway)
MARKERS = "os^Dv*"


def loss_curve(run: Run) -> tuple[list[float], list[float]] | None:
    curve = (run.summary or {}).get("loss_curve") or {}
    samples, loss = curve.get("samples") or [], curve.get("loss") or []
    return (samples, loss) if samples and len(samples) == len(loss) else None


def val_metric(run: Run) -> tuple[str, float] | None:
    """The final validation's accuracy, else its loss."""
    val = (run.summary or {}).get("val") or {}
    for name in ("acc", "loss"):
        if isinstance(val.get(name), int | float):
            return f"val {name}", float(val[name])
    return None


def draw_learning(report: Report) -> list[Path]:
    """Draw curves.png and race.png where the runs have what they show; the paths drawn."""
    drawn = []
    if any(loss_curve(run) for run in report.runs):  # every run that trained has one
        drawn.append(draw_curves(report, report.directory / CURVES_FILE))
    if any(racing(run) for run in report.runs):
        drawn.append(draw_race(report, report.directory / RACE_FILE))
    return drawn


def draw_curves(report: Report, path: Path) -> Path:
    figure, (losses, bars) = _figure()
    styles = _styles(report)
    for run in report.runs:
        if curve := loss_curve(run):
            losses.plot(*curve, markersize=4, label=_label(report, run), **styles[run.name])
    losses.set_xlabel("samples seen")
    losses.set_ylabel("training loss (mean over each bucket of micro-batches)")
    losses.set_title("Training loss")
    losses.grid(True, alpha=0.3)
    _legend(losses, report)
    _draw_val_bars(report, bars, {name: style["color"] for name, style in styles.items()})
    figure.suptitle(f"{report.directory.name}: what each run learned", fontsize=13)
    return _save(figure, path)


def _draw_val_bars(report: Report, axes, colors: dict[str, str]) -> None:
    runs = [run for run in report.runs if val_metric(run)][::-1]  # the table's first on top
    values = [val_metric(run)[1] for run in runs]
    positions = range(len(runs))
    axes.barh(positions, values, color=[colors[run.name] for run in runs], height=0.6)
    for position, value in zip(positions, values, strict=True):
        axes.text(value, position, f" {value:.4f}", va="center", fontsize=8)
    axes.set_yticks(list(positions), [_label(report, run) for run in runs], fontsize=8)
    names = sorted({val_metric(run)[0] for run in runs})
    axes.set_xlabel(" / ".join(names) + " (the final validation)")
    axes.set_xlim(0, max(values, default=1.0) * 1.2 or 1.0)
    axes.set_title("Validation metric")
    axes.grid(True, axis="x", alpha=0.3)


def draw_race(report: Report, path: Path) -> Path:
    figure, (by_time, by_samples) = _figure()
    styles = _styles(report)
    runs = [run for run in report.runs if racing(run)]
    for run in runs:
        history = run.summary["target_history"]
        values = [entry["value"] for entry in history]
        for axes, key in ((by_time, "time_s"), (by_samples, "samples")):
            axes.plot(
                [e[key] for e in history],
                values,
                markersize=4,
                label=_label(report, run),
                **styles[run.name],
            )
    targets = [run.summary["target"] for run in runs]
    values = {t["value"] for t in targets if t.get("value") is not None}
    metrics = " / ".join(sorted({str(t.get("metric")) for t in targets}))
    for axes in (by_time, by_samples):
        for value in values:
            axes.axhline(value, color="black", linestyle="--", linewidth=1)
        axes.set_ylabel(f"{metrics} (each validation)")
        axes.grid(True, alpha=0.3)
    by_time.set_xlabel("wall time from the first step (s)")
    by_time.set_title("Against wall time (dashed: the target)")
    by_samples.set_xlabel("samples seen")
    by_samples.set_title("Against samples seen")
    _legend(by_samples, report)
    groups = seed_groups(report)
    reached = sum(len(g.reached) for g in groups)
    figure.suptitle(
        f"{report.directory.name}: the race, {reached} of {len(runs)} runs reached the target",
        fontsize=13,
    )
    return _save(figure, path)


def _figure():
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(WIDTH_IN, HEIGHT_IN), dpi=DPI)
    FigureCanvasAgg(figure)
    return figure, figure.subplots(1, 2)


def _save(figure, path: Path) -> Path:
    figure.tight_layout()
    figure.savefig(path, dpi=DPI)
    return path


def _styles(report: Report) -> dict[str, dict]:
    """A colour per configuration (runs that differ only in their seed share one), a marker
    per seed within it."""
    from matplotlib import colormaps

    palette = colormaps["tab10"].colors
    configs: dict[tuple, list[str]] = {}
    for run in report.runs:
        key = tuple(sorted(without_seed(report.varying_overrides(run))))
        configs.setdefault(key, []).append(run.name)
    return {
        name: {"color": palette[i % len(palette)], "marker": MARKERS[j % len(MARKERS)]}
        for i, names in enumerate(configs.values())
        for j, name in enumerate(names)
    }


def _label(report: Report, run: Run) -> str:
    from tuneup.report.figure import label

    return label(report, run)


def _legend(axes, report: Report) -> None:
    if len(report.runs) <= LEGEND_RUNS and axes.get_legend_handles_labels()[0]:
        axes.legend(fontsize=7, loc="best")


def learning_sections(report: Report) -> list[str]:
    """report.md's sections after the table: the curves (when drawn) and the race (when run)."""
    from tuneup.report.race import race_section

    drawn = {path.name for path in report.drawn}
    lines = []
    if CURVES_FILE in drawn:
        lines += [
            "## Learning curves",
            "",
            "Each run's training loss against samples seen and its final validation metric: "
            f"[{CURVES_FILE}]({CURVES_FILE})",
            "",
            f"![learning curves]({CURVES_FILE})",
            "",
        ]
    race = race_section(report, RACE_FILE if RACE_FILE in drawn else None)
    return lines + ([*race, ""] if race else [])
