"""Sweep reports: what each run of a sweep bought in speed and memory and cost in accuracy.

:func:`build_report` reads every run's ``summary.json`` and Hydra overrides
under a directory (a sweep's, or one of single runs), compares each with the
baseline run and ranks them; :func:`write_report` writes ``report.md`` (one
row per run, the best run on top) and ``report.png`` (samples/s against peak
memory, and speed-up bars) into that directory, with ``curves.png`` (what each
run learned) and, for runs that raced to a target, ``race.png`` and a
time-to-target table (tuneup/report/curves.py, race.py). A sweep writes them when it
ends (``tuneup/report/callback.py``); for an existing directory run
``python -m tuneup.report <dir>``. In an autotune's folder the answer is autotune.md: the
report lists the trials in job order and names no best (tuneup/report/trials.py).

Settings, the config node ``report`` (saved with every run in
``.hydra/config.yaml``, so a report made later compares as the sweep did):

- ``baseline``: the run the others are compared with. null: the first run
  (job 0 of a sweep); a run's name (its job number); or overrides that
  name exactly one run, e.g. ``"report.baseline='precision=fp32 memory_format=contiguous'"``.
- ``rank_by``: ``samples_per_s`` (fastest first; best = the fastest run whose
  val acc is at most ``val_acc_tolerance`` below the baseline's) or
  ``val_acc`` (best val acc first; best = the highest val acc).
- ``fail_on_failed_runs``: the sweep exits with code 1 when a run did not finish
  (callback.py); experiment=autotune turns it off.

Noise: each row shows the spread of the run's speed windows and the speed-up's 95%
interval (Welch's t over the windows of the run and the baseline,
tuneup/stats/interval.py). A speed-up whose interval includes 1.0 is marked "within
noise". The interval sees the variation inside each run only, not load that differed
between two runs; ``experiment=autotune`` measures repeats interleaved for that.
"""

from __future__ import annotations

from pathlib import Path

from tuneup.report.comparison import (
    CONFIDENCE,
    RANK_BY,
    Report,
    ReportError,
    Settings,
    common_overrides,
    is_autotune,
    pick_baseline,
    pick_best,
    ranked,
    report_notes,
)
from tuneup.report.runs import Run, find_runs, saved_node

MARKDOWN_FILE = "report.md"
FIGURE_FILE = "report.png"


def build_report(
    directory, baseline=None, rank_by=None, val_acc_tolerance=None, settings=None
) -> Report:
    """Compare the runs under ``directory``.

    Settings: ``settings`` if given, else those saved with the runs (their
    ``report`` config node), each replaced by an argument that is not None.
    """
    directory = Path(directory)
    runs = find_runs(directory) if directory.is_dir() else []
    if not any(run.summary for run in runs):
        raise ReportError(
            f"no runs in {directory}: expected run directories holding summary.json, "
            "e.g. a sweep directory (multirun/<date>/<time>) or a directory of single runs "
            "(outputs/<date>); pass the directory that a sweep or runs wrote"
        )
    settings = settings or Settings.from_node(saved_node(runs[0].path, "config.yaml", "report"))
    settings = Settings(
        baseline=settings.baseline if baseline is None else str(baseline),
        rank_by=rank_by or settings.rank_by,
        val_acc_tolerance=(
            settings.val_acc_tolerance if val_acc_tolerance is None else float(val_acc_tolerance)
        ),
    )
    settings.check()
    base = pick_baseline(runs, settings.baseline)
    autotune = is_autotune(runs)
    report = Report(
        directory=directory,
        settings=settings,
        runs=runs if autotune else ranked(runs, settings.rank_by),
        baseline=base,
        best=None if autotune else pick_best(runs, base, settings),
        common_overrides=common_overrides(runs),
        notes=report_notes(runs, directory),
        autotune=autotune,
    )
    from tuneup.report.race import judge_race

    judge_race(report)  # with a target: the best configuration over its seeds
    return report


def write_report(report: Report) -> list[Path]:
    """Write ``report.md`` and, where matplotlib is installed, ``report.png``; return the paths."""
    from tuneup.report.markdown import render_markdown

    written = []
    try:
        from tuneup.report.figure import draw_figure
    except ImportError:
        report.notes.append(
            f"{FIGURE_FILE}, curves.png and race.png were not drawn: drawing needs matplotlib "
            "(pip install 'tuneup[sweep]')."
        )
    else:
        from tuneup.report.curves import draw_learning

        written.append(draw_figure(report, report.directory / FIGURE_FILE))
        written += draw_learning(report)  # curves.png, race.png: tuneup/report/curves.py
        report.drawn = written[:]
    markdown = report.directory / MARKDOWN_FILE
    markdown.write_text(render_markdown(report))
    return [markdown, *written]


__all__ = [
    "CONFIDENCE",
    "FIGURE_FILE",
    "MARKDOWN_FILE",
    "RANK_BY",
    "Report",
    "ReportError",
    "Run",
    "Settings",
    "build_report",
    "write_report",
]
