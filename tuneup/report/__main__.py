"""``python -m tuneup.report <dir>``: write report.md and report.png for the runs under <dir>.

<dir> is a sweep directory (``multirun/<date>/<time>``) or a directory of
single runs (``outputs/<date>``). Without options the report compares as the
sweep did (the ``report`` settings saved with the runs). Exit code 0 when the
report was written (also when some runs failed: the report says which), 1
when it could not be.
"""

from __future__ import annotations

import argparse
import sys

from tuneup.report.build import build_report, write_report
from tuneup.report.comparison import RANK_BY, ReportError


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tuneup.report",
        description="Compare the runs of a sweep (or a directory of single runs) side by side.",
    )
    parser.add_argument("directory", help="sweep directory or directory of single runs")
    parser.add_argument(
        "--baseline",
        help="run to compare with: its name (job number) or overrides it has, "
        "e.g. 'precision=fp32 memory_format=contiguous' (default: report.baseline, else the first run)",
    )
    parser.add_argument(
        "--rank-by",
        choices=RANK_BY,
        help="table order and what 'best' means (default: report.rank_by, else samples_per_s)",
    )
    parser.add_argument(
        "--val-acc-tolerance",
        type=float,
        help="with samples_per_s: how far below the baseline's val acc the best run may be "
        "(default: report.val_acc_tolerance, else 0.01)",
    )
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        report = build_report(
            args.directory,
            baseline=args.baseline,
            rank_by=args.rank_by,
            val_acc_tolerance=args.val_acc_tolerance,
        )
    except ReportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for path in write_report(report):
        print(f"written: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
