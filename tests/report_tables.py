"""Read what a sweep report shows: the table of report.md and the size of report.png."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

MIB = 2**20


def read_table(markdown: str) -> list[dict[str, str]]:
    """The rows of report.md's table, each a dict from column title to cell text."""
    lines = [line for line in markdown.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    return [
        dict(zip(header, (c.strip() for c in line.strip("|").split(" | ")), strict=True))
        for line in lines[2:]
    ]


def run_name(row: dict[str, str]) -> str:
    """``3`` from ``3 (baseline, best)``."""
    return row["run"].split(" (")[0]


def best_line(markdown: str) -> str:
    return next(line for line in markdown.splitlines() if line.startswith("**Best"))


def png_size(path: Path) -> tuple[int, int]:
    """Width and height from a PNG's header; fails if the file is not a PNG."""
    data = Path(path).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def number(cell: str) -> float | None:
    """A table cell as a number: '1,234.5 MiB' -> 1234.5, '1.52x' -> 1.52, '-' -> None."""
    text = cell.replace(",", "").removesuffix(" MiB").removesuffix("x")
    return None if text == "-" else float(text)


def assert_row_matches(row: dict[str, str], run_dir: Path, baseline_dir: Path) -> None:
    """Every figure in the row is the run's summary.json value, as rounded for display."""
    summary = json.loads((run_dir / "summary.json").read_text())
    base = json.loads((baseline_dir / "summary.json").read_text())
    expected = {
        "samples/s": (summary.get("samples_per_s"), 0.05),
        "speed-up": (_ratio(summary.get("samples_per_s"), base.get("samples_per_s")), 0.005),
        "peak memory": (_mib(summary.get("peak_memory_bytes")), 0.05),
        "memory vs baseline": (
            _ratio(summary.get("peak_memory_bytes"), base.get("peak_memory_bytes")),
            0.005,
        ),
        "train loss": (summary.get("train_loss"), 5e-5),
        "val acc": ((summary.get("val") or {}).get("acc"), 5e-5),
    }
    for column, (value, rounding) in expected.items():
        shown = number(row[column])
        if value is None:
            assert shown is None, f"{column}: {row[column]!r} shown, summary has none"
        else:
            assert shown == pytest.approx(value, abs=rounding * 1.001), (column, row, value)
    assert row["status"].split(":")[0] == summary["status"]


def _ratio(value, base):
    return None if value is None or not base else value / base


def _mib(value):
    return None if value is None else value / MIB
