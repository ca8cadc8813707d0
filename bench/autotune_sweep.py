"""The digits time-to-target autotune that bench/autotune_workers.py and
bench/autotune_budget.py run, and what they read back from its sweep folder.

A sweep is ``python run.py -m experiment=autotune ...`` in a process of its own, as a user
runs it; its figures come from the files the autotune writes: autotune.json (minutes used,
the study's trials, the confirmed configurations, the answer) and the study's journal (when
each study trial started and ended: autotune.json does not keep the times).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import race_tasks

ROOT = Path(__file__).resolve().parents[1]

#: docs/autotune.md's digits command (docs/benchmarks.md, "The autotune's budget on digits"):
#: the race's digits task as a time-to-target autotune.
DIGITS = [
    "experiment=autotune",
    "autotune.objective=time_to_target",
    *race_tasks.TASKS["digits"]["command"],
]
#: Study trials that ran (a FAIL was refused before it ran, or its job died).
RAN = ("COMPLETE", "PRUNED")


def sweep(overrides: list[str], folder: Path, env: dict | None = None) -> dict:
    """One autotune sweep into ``folder``: its wall seconds, exit code and autotune.json
    (None when it wrote none); the console goes to ``folder/sweep.log``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, str(ROOT / "run.py"), "-m", *overrides, f"hydra.sweep.dir={folder}"]
    started = time.monotonic()
    with open(folder / "sweep.log", "w") as log:
        done = subprocess.run(
            command, cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT, text=True
        )
    wall = time.monotonic() - started
    record = folder / "autotune.json"
    return {
        "command": ["python", "run.py", "-m", *overrides],
        "folder": str(folder),
        "returncode": done.returncode,
        "wall_s": wall,
        "record": json.loads(record.read_text()) if record.is_file() else None,
    }


def fresh(folders: list[Path]) -> None:
    """Refuse sweep folders that exist: a sweep into one continues the study its journal holds
    (a continued search), so its figures would not be a new search's."""
    taken = [str(f) for f in folders if Path(f).exists()]
    if taken:
        raise SystemExit(
            f"error: {taken[0]} exists: a sweep there would continue its study; "
            "give a new --out (or remove it)"
        )


def failure(folder: Path) -> str:
    """The last line of a failed sweep's console (its ``error: ...`` line, usually)."""
    lines = (Path(folder) / "sweep.log").read_text(errors="replace").strip().splitlines()
    errors = [line for line in lines if line.startswith("error:")]
    return (errors or lines or ["no output"])[-1]


def study_trials(record: dict) -> dict[str, int]:
    """The study's own trials (your command's baseline aside) by state, as autotune.json's
    ``explore`` lists them: ``{"COMPLETE": 43, "PRUNED": 58}``."""
    counts: dict[str, int] = {}
    for trial in record.get("explore") or []:
        if not trial.get("baseline"):
            counts[trial["state"]] = counts.get(trial["state"], 0) + 1
    return counts


def ran(counts: dict[str, int]) -> int:
    return sum(counts.get(state, 0) for state in RAN)


def trials_text(counts: dict[str, int]) -> str:
    """``101 (43 complete, 58 pruned)``."""
    parts = ", ".join(f"{n} {state.lower()}" for state, n in sorted(counts.items()) if n)
    return f"{ran(counts)} ({parts})" if parts else "0"


def journal_times(record: dict) -> list[tuple[float, float, bool]]:
    """(start, end, baseline) in POSIX seconds of each study trial that ended, read from the
    study's storage (autotune.json's ``study.storage``)."""
    import optuna

    storage = record["study"]["storage"]
    if "://" not in storage:
        backend = optuna.storages.journal.JournalFileBackend(storage)
        storage = optuna.storages.JournalStorage(backend)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=record["study"]["name"], storage=storage)
    return [
        (
            t.datetime_start.timestamp(),
            t.datetime_complete.timestamp(),
            bool(t.user_attrs.get("tuneup_baseline")),
        )
        for t in study.get_trials(deepcopy=False)
        if t.datetime_start and t.datetime_complete
    ]


def explore_seconds(times: list[tuple[float, float, bool]]) -> float | None:
    """The explore stage's wall seconds: the first study trial's start to the last one's end
    (the baseline enters the study as a finished trial, not run there: left out)."""
    own = [(start, end) for start, end, baseline in times if not baseline]
    if not own:
        return None
    return max(end for _, end in own) - min(start for start, _ in own)


def pick(record: dict) -> dict:
    """The search's answer: its overrides (empty: your command kept), its estimated time to
    target in seconds and where that figure comes from, and its median steps to target on
    the paired seeds. The estimate is the confirmed row's ``estimated_time`` (steps on the
    paired seeds x the seconds per step timed against your command, + validations) where the
    search states one, else the mean of the row's per-seed times to target (``cost_interval``,
    with ``autotune.cost=time``)."""
    found = list((record.get("recipe") or {}).get("found") or [])
    rows = record.get("confirmed") or []
    row = next((r for r in rows if r["overrides"] == found), None)
    if row is None and not found:
        row = next((r for r in rows if r["label"] == "baseline"), None)
    seconds, source = None, None
    if row is not None:
        if (row.get("estimated_time") or {}).get("estimate") is not None:
            seconds, source = row["estimated_time"]["estimate"], "estimated_time"
        elif (record.get("cost") or {}).get("name") == "time" and row.get("cost_interval"):
            seconds, source = row["cost_interval"]["estimate"], "paired seeds' mean"
    steps = [s for s in (row or {}).get("steps_to_target") or [] if s is not None]
    return {
        "overrides": found,
        "seconds": seconds,
        "source": source,
        "steps": statistics.median(steps) if steps else None,
        "verdict": str(record.get("verdict") or ""),
    }


def median(values) -> float | None:
    found = [v for v in values if v is not None]
    return statistics.median(found) if found else None


def clean_env(**changes: str) -> dict:
    """This process's environment without ``OMP_NUM_THREADS`` (the autotune's workers set
    their own; a run alone gets every core), plus ``changes``."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    return {**env, "PYTHONUNBUFFERED": "1", **changes}


def training_command(commands: list[list[str]]) -> list[str]:
    """The task's training command from sweeps' commands (``python run.py -m ...``): their
    overrides without ``experiment=autotune`` and the autotune's and Hydra's own (``autotune.*``,
    ``hydra.*``, ``hydra/launcher``), which choose how the search runs, not what trains. Every
    sweep must give the same one: the picks are overrides on it."""
    found = {
        tuple(
            a
            for a in command[3:]
            if a != "experiment=autotune" and not a.lstrip("+~").startswith(("autotune.", "hydra"))
        )
        for command in commands
    }
    if len(found) != 1:
        raise SystemExit(
            f"error: the sweeps' commands train {len(found)} different commands; "
            "the picks can only be timed against one"
        )
    return list(found.pop())


def pick_recipes(results: list[dict], reference: str = "command") -> tuple[dict, dict]:
    """Each distinct pick once, for race_speed.measure: ``{reference: [], "seed0-W1": [...]}``
    (the command first; a pick that kept the command is the command), and which recipe each
    sweep's pick is: ``{(seed, arm): name}``. Sweeps without a pick are left out."""
    recipes: dict[str, list[str]] = {reference: []}
    names: dict[tuple, str] = {(): reference}
    chosen: dict[tuple, str] = {}
    for found in results:
        if "pick" not in found:
            continue
        key = tuple(found["pick"]["overrides"])
        if key not in names:
            names[key] = f"seed{found['seed']}-{found['arm']}"
            recipes[names[key]] = list(key)
        chosen[(found["seed"], found["arm"])] = names[key]
    return recipes, chosen


def one_decimal(value) -> str:
    return "-" if value is None else f"{value:,.1f}"


def seconds(value) -> str:
    return "-" if value is None else f"{value:.3f} s"
