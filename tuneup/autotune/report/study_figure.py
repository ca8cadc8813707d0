"""autotune.png of the time-to-target study: every run's target metric against the samples it
had seen (left) and against its wall time (right). Confirmed configurations in colour (the
baseline black, the pick thick), study trials thin grey (pruned ones dashed, ending where the
pruner stopped them); the target as a line. matplotlib's object API, no pyplot state."""

from __future__ import annotations

from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

DPI = 100


def draw_study_figure(record: dict, path: Path) -> Path:
    figure = Figure(figsize=(15, 6), dpi=DPI)
    FigureCanvasAgg(figure)
    by_samples, by_time = figure.subplots(1, 2)
    confirmed = {
        job: row
        for row in record["confirmed"]
        for job in [*row["jobs"], (row.get("held_out") or {}).get("job")]
        if job
    }
    pick = " ".join(record["recipe"]["found"])
    study = {t["job"]: t for t in record["explore"] if t["job"] is not None}
    colours, shown = {}, set()
    ran = {t["job"] for t in record["trials"]}
    earlier = [
        {"job": t["job"], "curve": t["curve"]}
        for t in record["explore"]
        if t["job"] not in ran and t.get("curve")
    ]  # a continued search's first part
    for trial in [*earlier, *record["trials"]]:
        curve = trial.get("curve") or {}
        if not curve.get("samples"):
            continue
        row = confirmed.get(trial["job"])
        if row is not None:
            name = row["label"]
            colour = "black" if name == "baseline" else colours.setdefault(name, f"C{len(colours)}")
            style = {"color": colour, "linewidth": 2.5 if name == pick else 1.4, "alpha": 0.9}
            text = (
                None if name in shown else name[:60] + (" (pick)" if name == pick and pick else "")
            )
            shown.add(name)
        else:
            pruned = (study.get(trial["job"]) or {}).get("state") == "PRUNED"
            style = {"color": "0.6", "linewidth": 0.8, "linestyle": "--" if pruned else "-"}
            text = None
        for axes, x in ((by_samples, curve["samples"]), (by_time, curve["time_s"])):
            axes.plot(x, curve["value"], label=text, **style)
    target = record["target"]
    for axes, xlabel in (
        (by_samples, "samples seen"),
        (by_time, "wall time from the first step (s)"),
    ):
        if target.get("value") is not None:
            axes.axhline(target["value"], color="red", linestyle=":", linewidth=1)
        axes.set_xlabel(xlabel)
        axes.set_ylabel(str(target.get("metric")))
        axes.grid(True, alpha=0.3)
    by_samples.set_title("target metric against samples (grey: study trials, dashed: pruned)")
    by_time.set_title("against time (paired seeds in colour)")
    if shown:
        by_samples.legend(fontsize=7, loc="best")
    figure.suptitle(
        f"autotune time to target on {record['device']}: {pick or 'your command'}", fontsize=11
    )
    figure.tight_layout()
    figure.savefig(path, dpi=DPI)
    return path
