"""A sweep's report made: :func:`build_report` compares the runs under a directory,
:func:`write_report` writes report.md and its figures there (tuneup.report says what each
shows and how the runs are compared)."""

from __future__ import annotations

from pathlib import Path

from tuneup.report.comparison import (
    Report,
    ReportError,
    Settings,
    common_overrides,
    is_autotune,
    outside_interval_notes,
    pick_baseline,
    pick_best,
    ranked,
    report_notes,
)
from tuneup.report.runs import find_runs, saved_node

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
    report.notes += outside_interval_notes(report)
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
