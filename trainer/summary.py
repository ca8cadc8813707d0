"""The run summary: printed as a table, written as ``summary.json`` in the run directory."""

from __future__ import annotations

import json
import os
from pathlib import Path

FILE_NAME = "summary.json"
RULE_MAX = 100  # the table's rules; a long value (a plugin's settings) runs past it


def write(summary: dict, run_dir: Path) -> Path:
    """Write ``summary.json`` atomically: a reader never sees a half-written file."""
    path = Path(run_dir) / FILE_NAME
    tmp = path.with_name(f".{FILE_NAME}.tmp")
    tmp.write_text(json.dumps(summary, indent=2, sort_keys=True, default=str) + "\n")
    os.replace(tmp, path)
    return path


def read(run_dir: Path) -> dict:
    return json.loads((Path(run_dir) / FILE_NAME).read_text())


def format_table(summary: dict) -> str:
    """A two-column table of the figures a user looks at first, then everything else."""
    rows = [(key, _format(value)) for key, value in _flatten(summary) if key != "plugins"]
    plugins = summary.get("plugins") or {}
    rows += [(f"plugin {name}", _format(settings)) for name, settings in plugins.items()]
    width = max(len(k) for k, _ in rows)
    rule = "-" * min(RULE_MAX, width + 2 + max(len(v) for _, v in rows))
    lines = ["tuneup run summary", rule]
    lines += [f"{key:<{width}}  {value}" for key, value in rows]
    lines.append(rule)
    return "\n".join(lines)


def one_line(summary: dict, label: str) -> str:
    """A run of a sweep in one line (its table is in summary.json): ``label`` names the job."""
    speed, acc = summary.get("samples_per_s"), (summary.get("val") or {}).get("acc")
    facts = [summary.get("status", "?")]
    facts += [f"{speed:.4g} samples/s"] if isinstance(speed, (int, float)) else []
    facts += [f"val acc {acc:.4f}"] if isinstance(acc, (int, float)) else []
    facts += [f"{summary['steps']} steps"] if "steps" in summary else []
    return f"{label}: {', '.join(facts)}"


def _flatten(summary: dict, prefix: str = ""):
    for key, value in summary.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and key != "plugins" and value and len(value) <= 8:
            yield from _flatten(value, f"{name}.")
        elif key == "per_rank" and isinstance(value, list):  # a row per process
            for figures in value:
                yield (
                    f"{name}.{figures.get('rank')}",
                    {k: v for k, v in figures.items() if k != "rank"},
                )
        else:
            yield name, value


def _format(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**6:
        return f"{value:,}"
    if isinstance(value, dict):
        return ", ".join(f"{k}={_format(v)}" for k, v in value.items()) or "-"
    return "-" if value is None else str(value)
