"""A run on a CPU that other runs share: OpenMP's spin, libgomp's default against tuneup's.

The ``tuneup`` command gives OpenMP's threads a short spin (``GOMP_SPINCOUNT=1000``) when
other processes keep the CPUs busy as it starts, and libgomp's default otherwise
(trainer/openmp.py). This bench times the same training run with libgomp's default
(``GOMP_SPINCOUNT=300000`` in the environment: what a process gets without tuneup's choice)
and as the command now chooses (nothing in the environment), paired and interleaved (the
order alternating from pair to pair), on an idle machine and beside K other training runs
(autotune_budget.py's ``Beside``: ``python run.py trainer.max_epochs=60`` in a loop, the
first ``--lead`` seconds before). The runs beside it spin as ``--beside-spin`` says:
``300000`` (other programs, as libgomp starts them) or ``tuneup`` (tuneup runs, as they now
start). Each row counts the runs that chose the short spin.

Per run the figure is its ``fit_seconds`` (summary.json: the training loop, not the
process's start); per pair the ratio tuneup / default, with Student's t interval over the
pairs' log ratios (tuneup.stats.interval.paired). Prints Markdown for docs/benchmarks.md and
writes contention.json to ``--out``.

    python bench/contention.py --out contention-out
    python bench/contention.py --out contention-out --beside 0 2 --beside-spin 300000 tuneup
    python bench/contention.py --out contention-out --report         # the table again
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]

import autotune_sweep as sw  # noqa: E402
from autotune_budget import Beside  # noqa: E402

from tuneup.stats.interval import paired  # noqa: E402

#: The runs timed: race_tasks' digits MLP to its target, and a small byte-level GPT.
TASKS = {
    "digits MLP, to 95% (65 steps)": [
        *sw.race_tasks.TASKS["digits"]["command"],
        "target.stop=true",
    ],
    "GPT 2x64 on python_source, 60 steps": [  # race_tasks' python_source, 60 steps, no target
        *(
            a
            for a in sw.race_tasks.TASKS["python_source"]["command"]
            if not a.startswith(("target.", "trainer.max_steps="))
        ),
        "trainer.max_steps=60",
    ],
}
#: The two arms: libgomp's own default, and what the tuneup command sets (nothing in the env).
ARMS = {"default": {"GOMP_SPINCOUNT": "300000"}, "tuneup": {}}
FILE_NAME = "contention.json"


def parse(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--beside", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--beside-spin", nargs="+", default=["300000", "tuneup"])
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--lead", type=float, default=8)
    parser.add_argument("--out", type=Path, default=Path("contention-out"))
    parser.add_argument("--report", action="store_true", help="no run: the table from --out")
    return parser.parse_args(argv)


def fit_seconds(command: list[str], run_dir: Path, env: dict) -> tuple[float, str | None]:
    """One run of ``command``; its summary's ``fit_seconds`` and ``openmp_wait``."""
    done = subprocess.run(
        [sys.executable, str(sw.ROOT / "run.py"), *command, f"hydra.run.dir={run_dir}"],
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode:
        raise SystemExit(f"error: a run failed ({run_dir}):\n{done.stderr[-2000:]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    return summary["fit_seconds"], summary.get("openmp_wait")


def measure(args, task: str, beside: int, spin: str, folder: Path) -> dict:
    """``--pairs`` pairs of the task's run, the order alternating, beside ``beside`` runs."""
    base = sw.clean_env()
    beside_env = {**base, **({} if spin == "tuneup" else {"GOMP_SPINCOUNT": spin})}
    times: dict[str, list[float]] = {arm: [] for arm in ARMS}
    waits: dict[str, list[str | None]] = {arm: [] for arm in ARMS}
    with Beside(beside, folder / "beside", args.lead, beside_env) as load:
        for i in range(args.pairs):
            order = list(ARMS) if i % 2 == 0 else list(ARMS)[::-1]
            for arm in order:
                env = {**base, **ARMS[arm]}
                seconds, wait = fit_seconds(TASKS[task], folder / f"{arm}{i}", env)
                times[arm].append(seconds)
                waits[arm].append(wait)
    ratio = paired(times["default"], times["tuneup"], 0.95)
    return {
        "task": task,
        "beside": beside,
        "beside_spin": spin if beside else None,
        "load": [min(load.loads), max(load.loads)] if load.loads else None,
        "seconds": times,
        "short_spin": sum(str(w).startswith("short spin") for w in waits["tuneup"]),
        "openmp_wait": waits,
        "ratio": [ratio.estimate, ratio.low, ratio.high] if ratio else None,
    }


def report(rows: list[dict]) -> str:
    lines = [
        "| run | beside it | default: fit s (median; range) | tuneup's: fit s | "
        "tuneup / default [95% interval] | tuneup's runs with the short spin |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for row in rows:
        beside = (
            "nothing" if not row["beside"] else f"{row['beside']} runs, spin {row['beside_spin']}"
        )
        if row["load"]:
            beside += f" (load {row['load'][0]:.1f}-{row['load'][1]:.1f})"
        cells = []
        for arm in ARMS:
            values = row["seconds"][arm]
            cells.append(f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})")
        est, low, high = row["ratio"]
        lines.append(
            f"| {row['task']} | {beside} | {cells[0]} | {cells[1]} | "
            f"{est:.2f}x [{low:.2f}, {high:.2f}] | {row['short_spin']} of {len(row['seconds']['tuneup'])} |"
        )
    return "\n".join(lines)


def main(argv=None) -> None:
    args = parse(argv)
    path = args.out / FILE_NAME
    if args.report:
        print(report(json.loads(path.read_text())["rows"]))
        return
    sw.fresh([args.out])
    data = {"pairs": args.pairs, "rows": []}
    settings = [(b, s) for b in args.beside for s in (args.beside_spin if b else ["-"])]
    for beside, spin in settings:
        for number, task in enumerate(TASKS):
            folder = args.out / f"beside{beside}-{spin}-{number}"
            data["rows"].append(measure(args, task, beside, spin, folder))
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(data, indent=1))
            print(report(data["rows"][-1:]).splitlines()[-1], file=sys.stderr, flush=True)
    print(report(data["rows"]))
    print(f"\n{path}", file=sys.stderr)


if __name__ == "__main__":
    main()
