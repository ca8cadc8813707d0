"""The Hydra callback that writes a sweep's report when the sweep ends (``hydra.callbacks`` in conf/config.yaml).

A failed run does not stop a sweep: ``tuneup.cli.task`` records it in its
``summary.json`` and returns NaN (see there), so every sweeper reaches the end
and this callback runs. It writes ``report.md`` and ``report.png`` into the
sweep directory, then ends the process with exit code 1 if any run did not
finish, so scripts and CI see the failure (unless ``report.fail_on_failed_runs`` is false:
experiment=autotune, whose failed trials are candidates it judged and explains).
"""

from __future__ import annotations

import logging
from pathlib import Path

from hydra.experimental.callback import Callback

log = logging.getLogger(__name__)


class SweepReport(Callback):
    def __init__(self) -> None:
        self.sweep_dir: Path | None = None

    def on_multirun_start(self, config, **kwargs) -> None:
        # Resolved now: hydra.sweep.dir holds ${now:...}, the time the sweep started.
        self.sweep_dir = Path(config.hydra.sweep.dir)

    def on_multirun_end(self, config, **kwargs) -> None:
        from tuneup.report.build import build_report, write_report
        from tuneup.report.comparison import ReportError, Settings

        sweep_dir = self.sweep_dir or Path(config.hydra.sweep.dir)
        try:
            report = build_report(sweep_dir, settings=Settings.from_node(config.get("report")))
            paths = write_report(report)
        except ReportError as exc:
            if (sweep_dir / "answered_by.json").is_file():  # an autotune that gave way: no run
                log.info("no sweep report: this sweep ran no job (answered_by.json)")
                return
            log.error("no sweep report: %s", exc)
            log.error("fix the setting, then: python -m tuneup.report %s", sweep_dir)
            raise SystemExit(1) from exc
        log.info("sweep report: %s", ", ".join(str(p) for p in paths))
        if report.not_ok:
            names = ", ".join(run.name for run in report.not_ok)
            fail = (config.get("report") or {}).get("fail_on_failed_runs", True)
            (log.error if fail else log.info)(
                "%d of %d runs did not finish (runs %s); their errors are in %s",
                len(report.not_ok),
                len(report.runs),
                names,
                paths[0],
            )
            if (
                fail
            ):  # SystemExit, not an Exception: Hydra turns a callback's Exception into a warning
                raise SystemExit(1)
