"""Whether ``autotune.budget_minutes`` is spent on the answer, idle and beside other runs (issue 50).

The digits time-to-target autotune (docs/autotune.md's command, every other setting at its
default) with each ``--minutes`` budget, on an idle machine (``--beside 0``) and with K
plain training runs beside it (``--beside K``: ``python run.py trainer.max_epochs=60``,
started again whenever one ends, the first ``--lead`` seconds before the autotune and all
stopped after it). Per run: the minutes used (autotune.json ``elapsed_seconds``) and the
wall time, the study's trials, the 1-minute load average seen while it ran, and the answer.
The goal (issue 50): each budget ends within 10 % of its minutes, either way, with at least
one study trial. Prints Markdown for docs/benchmarks.md and writes autotune_budget.json to
``--out``.

    python bench/autotune_budget.py --out budget-out                 # 2 and 10 minutes, idle
    python bench/autotune_budget.py --out budget-out --beside 0 2    # idle, then beside two runs
    python bench/autotune_budget.py --minutes 10 --trials 1000       # trials left throughout
    python bench/autotune_budget.py --minutes 1 --beside 0           # the pipeline, quickly
    python bench/autotune_budget.py --out budget-out --report        # the table again, nothing run
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]

import autotune_sweep as sw  # noqa: E402

#: Issue 50's goal: the minutes used within this share of the budget, either way.
TOLERANCE = 0.10
#: A plain training run beside the autotune (docs/benchmarks.md's loaded rows).
BESIDE = ["trainer.max_epochs=60"]
FILE_NAME = "autotune_budget.json"


def parse(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, nargs="+", default=[2, 10])
    parser.add_argument(
        "--beside", type=int, nargs="+", default=[0], help="training runs beside it (each K)"
    )
    parser.add_argument(
        "--trials", type=int, help="autotune.budget_trials (default: the autotune's own)"
    )
    parser.add_argument("--lead", type=float, default=8, help="seconds the runs beside start first")
    parser.add_argument("--out", type=Path, default=Path("autotune-budget-out"))
    parser.add_argument("--extra", nargs="*", default=[], help="more overrides for the autotune")
    parser.add_argument("--report", action="store_true", help="no run: the table from --out's JSON")
    return parser.parse_args(argv)


def overrides(args, minutes: float) -> list[str]:
    trials = [] if args.trials is None else [f"autotune.budget_trials={args.trials}"]
    return [*sw.DIGITS, f"autotune.budget_minutes={minutes:g}", *trials, *args.extra]


class Beside:
    """``count`` training runs in a loop, each a process group of its own, and the 1-minute
    load average sampled every few seconds, for as long as the ``with`` block runs."""

    def __init__(self, count: int, folder: Path, lead: float, env: dict, command=None):
        self.count, self.folder, self.lead, self.env = count, Path(folder), lead, env
        self.command = command or [sys.executable, str(sw.ROOT / "run.py"), *BESIDE]
        self.stop = threading.Event()
        self.started = 0
        self.loads: list[float] = []
        self.threads = [threading.Thread(target=self._loop, args=(k,)) for k in range(count)]
        self.threads.append(threading.Thread(target=self._sample))

    def __enter__(self):
        for thread in self.threads:
            thread.start()
        if self.count:
            self.stop.wait(self.lead)
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for thread in self.threads:
            thread.join()

    def _loop(self, k: int) -> None:
        number = 0
        while not self.stop.is_set():
            run_dir = self.folder / f"beside{k}-{number}"
            command = [*self.command, f"hydra.run.dir={run_dir}"]
            run_dir.mkdir(parents=True, exist_ok=True)
            with open(run_dir / "console.log", "w") as log:
                process = subprocess.Popen(
                    command,
                    cwd=run_dir,
                    env=self.env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            self.started += 1
            number += 1
            while process.poll() is None and not self.stop.wait(1):
                pass
            if process.poll() is None:
                _end(process)

    def _sample(self) -> None:
        while True:
            self.loads.append(os.getloadavg()[0])
            if self.stop.wait(5):
                return


def _end(process: subprocess.Popen) -> None:
    """SIGTERM to the run's process group, SIGKILL after 10 s."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, None)):
        try:
            os.killpg(process.pid, sig)
            process.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue
        except ProcessLookupError:
            return


def result(minutes: float, beside: int, done: dict, loads: list[float], started: int) -> dict:
    found = {
        "minutes": minutes,
        "beside": beside,
        "beside_runs": started,
        "command": done["command"],
        "folder": done["folder"],
        "wall_s": done["wall_s"],
        "load": [min(loads), max(loads)] if loads else None,
    }
    record = done["record"]
    if done["returncode"] or record is None:
        return {**found, "error": sw.failure(done["folder"])}
    return {
        **found,
        "elapsed_s": record.get("elapsed_seconds"),
        "trials": sw.study_trials(record),
        "budget_trials": (record.get("settings") or {}).get("budget_trials"),
        "stages": (record.get("stages") or {}).get("run"),
        "found": list((record.get("recipe") or {}).get("found") or []),
        "verdict": str(record.get("verdict") or ""),
    }


def goal(row: dict) -> tuple[bool, str]:
    """(met, why): within ``TOLERANCE`` of the minutes and at least one study trial."""
    if "error" in row:
        return False, "the autotune failed"
    used = row["elapsed_s"] / 60
    share = used / row["minutes"]
    trials = sw.ran(row["trials"])
    why = f"{used:.2f} of {row['minutes']:g} min, {share:.0%}; {trials} study trial(s)"
    if row["budget_trials"] and sum(row["trials"].values()) >= row["budget_trials"]:
        why += f"; the study's {row['budget_trials']} trials spent first"
    return abs(share - 1) <= TOLERANCE and trials >= 1, why


def table(rows: list[dict]) -> str:
    lines = [
        "| budget | runs beside it (load) | minutes used (elapsed_seconds; wall) "
        "| study trials | answer | goal |",
        "|---:|---|---:|---:|---|---|",
    ]
    for row in rows:
        load = "" if not row["load"] else f" ({row['load'][0]:.1f}-{row['load'][1]:.1f})"
        met, why = goal(row)
        if "error" in row:
            used, trials = f"- (wall {row['wall_s']:.0f} s)", "-"
            answer = f"failed: {row['error']}"
        else:
            used = f"{row['elapsed_s'] / 60:.2f} of {row['minutes']:g} (wall {row['wall_s']:.0f} s)"
            trials = sw.trials_text(row["trials"])
            what = " ".join(row["found"]) or "your command kept"
            answer = f"`{what}`: {row['verdict']}"
        lines.append(
            f"| {row['minutes']:g} min | {row['beside']}{load} | {used} | {trials} | {answer} | "
            f"{'met' if met else 'NOT met'} ({why}) |"
        )
    return "\n".join(lines)


def goals(rows: list[dict]) -> str:
    missed = [f"{r['minutes']:g} min beside {r['beside']}" for r in rows if not goal(r)[0]]
    verdict = "met" if not missed else f"NOT met ({', '.join(missed)})"
    return (
        f"- each budget ends within {TOLERANCE:.0%} of its minutes with at least one study "
        f"trial: {verdict}"
    )


def report(data: dict) -> str:
    commands = sorted({" ".join(shlex.quote(a) for a in r["command"]) for r in data["rows"]})
    beside = " ".join(["python", "run.py", *BESIDE])
    return "\n".join(
        [
            "```",
            *commands,
            f"# beside it, for the loaded rows: K runs of `{beside}` in a loop, "
            f"the first started {data['lead']:g} s before",
            "```",
            "",
            table(data["rows"]),
            "",
            "**Goal** (issue 50):",
            "",
            goals(data["rows"]),
        ]
    )


def main(argv=None) -> None:
    args = parse(argv)
    path = args.out / FILE_NAME
    if args.report:
        print(report(json.loads(path.read_text())))
        return
    data = {"lead": args.lead, "trials": args.trials, "rows": []}
    env = sw.clean_env()
    runs = [(b, m, args.out / f"{m:g}min-beside{b}") for b in args.beside for m in args.minutes]
    sw.fresh([folder for *_, folder in runs])
    for beside, minutes, folder in runs:
        with Beside(beside, folder / "beside", args.lead, env) as load:
            done = sw.sweep(overrides(args, minutes), folder / "sweep", env)
        data["rows"].append(result(minutes, beside, done, load.loads, load.started))
        path.write_text(json.dumps(data, indent=1))  # each run kept as it ends
        print(f"{minutes:g} min beside {beside}: {done['wall_s']:.0f} s", file=sys.stderr)
    print(report(data))
    print(f"\n{path}", file=sys.stderr)


if __name__ == "__main__":
    main()
