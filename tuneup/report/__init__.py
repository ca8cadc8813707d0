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

from tuneup.report.build import FIGURE_FILE, MARKDOWN_FILE, build_report, write_report
from tuneup.report.comparison import CONFIDENCE, RANK_BY, Report, ReportError, Settings
from tuneup.report.runs import Run

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
