"""The run summary: written as ``summary.json`` in the run directory, and printed as a table of
its headline figures that fits a screen (the rest is in the file)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tuneup.trainer import openmp

FILE_NAME = "summary.json"
RULE_MAX = 100  # the table's rules; a long value (a checkpoint's path) runs past it


def write(summary: dict, run_dir: Path) -> Path:
    """Write ``summary.json`` atomically: a reader never sees a half-written file."""
    path = Path(run_dir) / FILE_NAME
    tmp = path.with_name(f".{FILE_NAME}.tmp")
    tmp.write_text(json.dumps(summary, indent=2, sort_keys=True, default=str) + "\n")
    os.replace(tmp, path)
    return path


def read(run_dir: Path) -> dict:
    return json.loads((Path(run_dir) / FILE_NAME).read_text())


#: At most this many processes get a memory row of their own; more are summed up in one.
RANK_ROWS = 4


def format_table(summary: dict) -> str:
    """The run on one screen (at most ~25 lines): what was asked for first (the target, the
    speed, the memory), the metrics, where the files are; everything else is in summary.json.
    Each row is named by its key in summary.json."""
    rows = [(key, value) for make in ROWS for key, value in make(summary) if value]
    width = max((len(k) for k, _ in rows), default=0)
    lines = [
        f"tuneup run summary: {', '.join(filter(None, (summary.get('status'), _done(summary))))}"
    ]
    lines.append("-" * min(RULE_MAX, max([len(lines[0]), *(width + 2 + len(v) for _, v in rows)])))
    lines += [f"{key:<{width}}  {value}" for key, value in rows]
    lines.append(lines[1])
    return "\n".join(lines)


def _done(s: dict) -> str:
    """What the run did: ``8 steps, 1 epoch, 256 samples``, or the mode that trained nothing."""
    if s.get("mode"):
        return f"mode={s['mode']}"
    counts = [(s.get(k), k.removesuffix("s")) for k in ("steps", "epochs", "samples")]
    return ", ".join(_count(n, noun) for n, noun in counts if isinstance(n, int))


def _target(s: dict):
    target = s.get("target")
    if not isinstance(target, dict) or target.get("metric") is None:
        return
    sign = "<=" if target.get("mode") == "min" else ">="
    asked = f"{target['metric']} {sign} {_format(target.get('value'))}: "
    if target.get("reached"):
        asked += (
            f"reached at step {s.get('steps_to_target')} after "
            f"{_format(s.get('time_to_target_s'))} s"
        )
    else:
        asked += "not reached" if target.get("value") is not None else "no value asked"
    yield "target", f"{asked} (best {_format(target.get('best'))})"


def _speed(s: dict):
    if isinstance(s.get("samples_per_s"), (int, float)):
        times, wait = s.get("step_time_ms") or {}, s.get("data_wait_fraction")
        detail = [f"step_time_ms p50 {_ms(times.get('p50'))}, p90 {_ms(times.get('p90'))}"]
        detail += [f"data_wait_fraction {wait:.2g}"] if isinstance(wait, (int, float)) else []
        yield "samples_per_s", f"{_format(s['samples_per_s'])} ({'; '.join(detail)})"
    if isinstance(s.get("mfu"), (int, float)):
        yield "mfu", f"{s['mfu']:.3g} ({_format(s.get('achieved_tflops'))} TFLOP/s)"


def _memory(s: dict):
    if isinstance(s.get("peak_memory_bytes"), int):
        saved = s.get("saved_activation_bytes")
        extra = f" (saved_activation_bytes {_bytes(saved)})" if isinstance(saved, int) else ""
        yield "peak_memory_bytes", _bytes(s["peak_memory_bytes"]) + extra
    ranks = s.get("per_rank") if s.get("world_size", 1) > 1 else None
    if isinstance(ranks, list) and ranks:
        for figures in ranks[:RANK_ROWS]:
            held = {k: v for k, v in figures.items() if k.endswith("_bytes") and v is not None}
            yield (
                f"per_rank.{figures.get('rank')}",
                ", ".join(f"{k.removesuffix('_bytes')} {_bytes(v)}" for k, v in held.items()),
            )
        if len(ranks) > RANK_ROWS:
            peaks = [r.get("peak_memory_bytes") or 0 for r in ranks]
            yield (
                "per_rank",
                f"{len(ranks)} processes: peak {_bytes(min(peaks))} to {_bytes(max(peaks))}",
            )


def _metrics(s: dict):
    for key in ("val", "test"):
        if isinstance(s.get(key), dict) and s[key]:
            yield key, _format(s[key])
    if isinstance(s.get("predict"), dict):
        p = s["predict"]
        yield (
            "predict",
            f"{p.get('samples')} samples of the {p.get('split')} split: {p.get('file')}",
        )
    if s.get("train_loss") is not None:
        yield "train_loss", _format(s["train_loss"])


def _run(s: dict):
    size = f"world_size {s['world_size']}{_mesh(s)}" if "world_size" in s else None
    where = [s.get("device"), size]
    if str(s.get("openmp_wait", "")).startswith(openmp.SHORT):  # the load it started beside
        where.append(f"OpenMP {s['openmp_wait']}")
    yield "device", ", ".join(w for w in where if w)
    precision = s.get("precision") if isinstance(s.get("precision"), dict) else {}
    if precision.get("ran_as") not in (None, precision.get("name")):
        yield "precision", f"{precision.get('name')} ran as {precision['ran_as']}"
    if isinstance(s.get("fit_seconds"), (int, float)):
        yield "fit_seconds", _format(s["fit_seconds"])
    if s.get("dropped_per_epoch"):
        n = s["dropped_per_epoch"]
        yield (
            "dropped_per_epoch",
            (
                f"{_count(n, 'training sample')} left out of each epoch: "
                f"training batches are full, a different {n} each epoch"
            ),
        )
    for key in ("resumed_from", "short_of_limits"):
        if s.get(key):
            yield key, _format(s[key])
    for name, error in (s.get("report_errors") or {}).items():
        yield f"report_errors.{name}", error


def _mesh(s: dict) -> str:
    """`` (data_parallel 1 x tensor_parallel 2)`` under tensor parallelism: strategy=fsdp alone
    does not say that the processes split each layer rather than the batch."""
    plugins = s.get("plugins") if isinstance(s.get("plugins"), dict) else {}
    strategy = plugins.get("strategy") if isinstance(plugins.get("strategy"), dict) else {}
    mesh = strategy.get("mesh") if isinstance(strategy.get("mesh"), dict) else {}
    if (mesh.get("tensor_parallel") or 1) <= 1:
        return ""
    return (
        f" (data_parallel {mesh.get('data_parallel')} x tensor_parallel {mesh['tensor_parallel']})"
    )


def _files(s: dict):
    checkpoints = s.get("checkpoints") if isinstance(s.get("checkpoints"), dict) else {}
    if checkpoints.get("last"):
        yield "checkpoints", f"{checkpoints.get('written')} written; last {checkpoints['last']}"
    if s.get("run_dir"):
        folder = Path(s["run_dir"])
        there = [n for n in ("metrics.csv", "tuneup.log") if (folder / n).exists()]
        yield "run_dir", f"{folder}: {', '.join([f'{FILE_NAME} (every figure)', *there])}"
    if s.get("plugins"):
        yield "plugins", ", ".join(s["plugins"])


#: The table's rows, in order: what was asked for, the metrics, the run, where its files are.
ROWS = (_target, _speed, _memory, _metrics, _run, _files)


def _count(value: int, noun: str) -> str:
    return f"{value:,} {noun}{'' if value == 1 else 's'}"


def _ms(value) -> str:
    return (
        "-"
        if not isinstance(value, (int, float))
        else f"{value:.3g}"
        if value < 100
        else (f"{value:,.0f}")
    )


def _bytes(value: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(value) >= size:
            return f"{value / size:.3g} {unit}"
    return f"{value} B"


def one_line(summary: dict, label: str) -> str:
    """A run of a sweep in one line (its table is in summary.json): ``label`` names the job."""
    speed, acc = summary.get("samples_per_s"), (summary.get("val") or {}).get("acc")
    facts = [summary.get("status", "?")]
    facts += [f"{speed:.4g} samples/s"] if isinstance(speed, (int, float)) else []
    facts += [f"val acc {acc:.4f}"] if isinstance(acc, (int, float)) else []
    facts += [f"{summary['steps']} steps"] if "steps" in summary else []
    return f"{label}: {', '.join(facts)}"


def _format(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**6:
        return f"{value:,}"
    if isinstance(value, dict):
        return ", ".join(f"{k}={_format(v)}" for k, v in value.items()) or "-"
    return "-" if value is None else str(value)
