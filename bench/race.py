"""The race on the clock, on tasks the search was not tuned on (issue 50).

Seven tasks of real data every install has (bench/race_tasks.py: digits' MLP and
python_source's GPT, a conv net, the breast-cancer table, the language reference's text,
and held-out variants of the first two). Contenders, each a ``--runs`` choice:

- ``default``: the task's command;
- ``hand``: the best of ``optimizer.lr`` x {1/3, 1, 3, 10} on seed 0, by steps to target;
- ``algoperf``: AlgoPerf's external-tuning baseline (race_runs.algoperf_trials), 5 trials
  on seed 0, its schedule over the task's ``step_hint``;
- ``random``: random search (``autotune.sampler=random``), the same trials, budget, pruner;
- ``autotune``: autotune's pick (TPE), and ``autotune_steps`` (``autotune.cost=steps``, the
  GPU proxy; not in the default runs);
each search run once per sampler seed of the frozen file (3 independent searches), every
search with the settings of bench/race_frozen_2026-11-29.yaml (refused otherwise unless
``--unfrozen``; its sha256 is in the output). Each recipe is then trained to the target on
seeds the searches never saw (10, 11, 12), and its seconds per step measured in short
interleaved throughput trials of every recipe of the task in one window (race_speed.py).
Time to target = median steps to target x seconds per step. Writes race.md (tables,
misses, the performance profile), race.json and race_profile.png to ``--out``.

    python bench/race.py --out race-out             # everything: hours (7 tasks x 2 x 3 searches of 10 minutes, then the races)
    python bench/race.py --tasks digits_conv --runs default hand algoperf
    python bench/race.py --runs autotune_steps --tasks digits     # the GPU proxy's searches
    python bench/race.py --smoke                    # 2 tasks, 1 seed, 2-trial searches: the pipeline in ~2 min
    python bench/race.py --check                    # every command and the frozen settings checked, nothing trained
    python bench/race.py --choose-targets --tasks digits_deep     # the default on seed 0 at full length
    python bench/race.py --out all --combine out-digits out-conv   # one report over earlier runs
    python bench/race.py --out again --remeasure out-digits       # their recipes timed again
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]

import race_goals  # noqa: E402
import race_report  # noqa: E402
import race_runs  # noqa: E402
import race_speed  # noqa: E402
import race_targets  # noqa: E402
import race_tasks  # noqa: E402
from race_tasks import SEARCHES, SMOKE_TASKS, TASKS  # noqa: E402

RUNS = ("default", "hand", "algoperf", "random", "autotune", "autotune_steps")
DEFAULT_RUNS = RUNS[:5]
#: A combined task's note on the contenders whose seconds per step another run's window timed.
OTHER_WINDOW = "its seconds per step timed in that run's window"
SMOKE = {"budget_minutes": 0.25, "budget_trials": 2, "seeds": 2, "confirm": 1}


def parse(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="+", choices=list(TASKS))
    parser.add_argument("--runs", nargs="+", choices=RUNS, default=list(DEFAULT_RUNS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[10, 11, 12])
    parser.add_argument("--out", help="keep everything here (default: a temporary folder)")
    parser.add_argument("--frozen", type=Path, default=race_tasks.FROZEN)
    parser.add_argument(
        "--set",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="change a frozen autotune setting (needs --unfrozen)",
    )
    parser.add_argument(
        "--unfrozen", action="store_true", help="allow search settings other than the frozen file's"
    )
    parser.add_argument(
        "--combine",
        nargs="+",
        type=Path,
        metavar="DIR",
        help="no run: one report over the race.json of these earlier --out folders",
    )
    parser.add_argument(
        "--remeasure",
        nargs="+",
        type=Path,
        metavar="DIR",
        help="no search, no race: time the recipes of these earlier --out folders again",
    )
    parser.add_argument("--speed-rounds", type=int, default=5)
    parser.add_argument("--speed-steps", type=int, default=512)
    parser.add_argument(
        "--speed-seconds",
        type=float,
        default=3.0,
        help="a throughput trial stops after this much training or --speed-steps",
    )
    parser.add_argument("--smoke", action="store_true", help="tiny budgets: the pipeline only")
    parser.add_argument("--check", action="store_true", help="check the commands, train nothing")
    parser.add_argument(
        "--choose-targets",
        action="store_true",
        help="run each task's default on seed 0 at full length; print the target rule's figures",
    )
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if args.smoke:
        args.tasks = args.tasks or list(SMOKE_TASKS)
        args.seeds, args.speed_rounds, args.speed_steps = args.seeds[:1], 2, 8
        args.speed_seconds = 1.0
    args.tasks = args.tasks or list(TASKS)
    return args


def frozen_settings(args) -> dict:
    """The frozen file's settings; under --smoke its budgets made tiny and any key this
    tuneup does not know left out (said in the notes), the run marked unfrozen."""
    if not args.smoke:
        return race_tasks.load_frozen(args.frozen, args.unfrozen, tuple(args.set))
    from tuneup.autotune.settings import Settings

    changes = (*args.set, *(f"{k}={v}" for k, v in SMOKE.items()))
    frozen = race_tasks.load_frozen(args.frozen, True, changes)
    known = set(Settings.__dataclass_fields__)
    for where in (frozen["settings"], *frozen["contenders"].values()):
        for key in [k for k in where if k not in known]:
            frozen.setdefault("left_out", []).append(f"autotune.{key}={where.pop(key)}")
    frozen["sampler_seeds"] = frozen["sampler_seeds"][:1]
    return frozen


def contenders(name: str, command: list[str], args, frozen: dict, folder: Path):
    """(contender, label, overrides, a search's new-seed interval) for each --runs choice
    (the default always: the reference), and notes."""
    limit = ["++trainer.max_time=00:00:00:10"] if args.smoke else []
    rows, notes = [("default", "default", [], None)], []
    if "hand" in args.runs:
        extra, note = race_runs.hand_rule(command, folder / "hand", limit)
        rows.append(("hand", "hand rule", extra, None))
        notes += note
    if "algoperf" in args.runs:
        hint = TASKS[name]["step_hint"]
        extra, note = race_runs.algoperf_pick(
            command, hint, folder / "algoperf", 2 if args.smoke else 5, limit
        )
        rows.append(("algoperf", "AlgoPerf's baseline", extra, None))
        notes += [f"{note[0]} (step_hint {hint})"]
    for contender in [r for r in args.runs if r in SEARCHES]:
        for seed in frozen["sampler_seeds"]:
            overrides = race_tasks.search_overrides(frozen, contender, seed)
            pick, verdict, interval = race_runs.search(
                command, overrides, folder / f"{contender}{seed}"
            )
            rows.append((contender, f"{contender} #{seed}", pick, interval))
            notes.append(f"{contender} #{seed}: {verdict}")
    return rows, notes, limit


def run_task(name: str, args, frozen: dict, folder: Path) -> dict:
    command = race_tasks.command(name, folder)
    found, notes, limit = contenders(name, command, args, frozen, folder)
    raced: dict[tuple, list] = {}
    rows = []
    for contender, label, extra, interval in found:
        key = tuple(extra)
        if key not in raced:
            raced[key] = race_runs.race(
                command, extra, args.seeds, folder / f"race{len(raced)}", limit
            )
        rows.append(
            {
                "contender": contender,
                "label": label,
                "overrides": extra,
                "summaries": raced[key],
                "interval": interval,
            }
        )
    return {
        "task": name,
        "command": race_tasks.shown(command),
        "rows": rows,
        "speed": timed(command, rows, args, folder / "speed"),
        "notes": notes,
    }


def timed(command: list[str], rows: list[dict], args, folder: Path) -> dict:
    """Each row's seconds per step, every recipe of the task timed in one window."""
    unique: dict[tuple, str] = {}  # a recipe two contenders share is timed once
    for row in rows:
        unique.setdefault(tuple(row["overrides"]), row["label"])
    recipes = {label: list(key) for key, label in unique.items()}  # the default's first
    measured = race_speed.measure(
        command,
        recipes,
        folder,
        args.speed_rounds,
        args.speed_steps,
        limit_s=args.speed_seconds,
    )
    return {row["label"]: measured[unique[tuple(row["overrides"])]] for row in rows}


def remeasure(args, out: Path) -> None:
    """The recipes of earlier runs timed again (this run's --speed-* settings), one window
    per task; the steps to target are theirs."""
    results, frozen = [], None
    for folder in args.remeasure:
        data = json.loads((folder / "race.json").read_text())
        frozen = frozen or data.get("frozen")
        args.seeds = data.get("seeds", args.seeds)
        for result in data["results"]:
            name = result["task"]
            command = race_tasks.command(name, out / name)
            result["speed"] = timed(command, result["rows"], args, out / name / "speed")
            result["notes"] = [n for n in result["notes"] if OTHER_WINDOW not in n]
            result["notes"].append(f"every recipe timed again in one window (--remeasure {folder})")
            results.append(result)
    write(out, report(results, args, frozen, 0.0), results, frozen, args.seeds)


def report(results: list[dict], args, frozen: dict | None, seconds: float) -> str:
    head = [
        "## bench/race.py",
        "",
        f"Seeds {', '.join(map(str, args.seeds))}; runs: {' '.join(args.runs)}; "
        f"{seconds / 60:.1f} min; speed: {args.speed_rounds} interleaved rounds of "
        f"{args.speed_steps} steps or {args.speed_seconds:g} s of training.",
        "",
    ]
    if frozen:
        state = "frozen" if frozen["frozen"] else "UNFROZEN (--unfrozen, --set or --smoke)"
        head += [
            f"Search settings: {frozen['file']} sha256 {frozen['sha256']} ({state}): "
            f"{json.dumps(frozen['settings'])}; sampler seeds {frozen['sampler_seeds']}"
            + (
                f"; left out (unknown to this tuneup): {', '.join(frozen['left_out'])}"
                if frozen.get("left_out")
                else ""
            ),
            "",
        ]
    lines = [*head]
    for result in results:
        lines += race_report.task_table(result)
    lines += race_report.overall_table(results) + race_goals.against_table(results)
    lines += race_goals.searches_table(results)
    lines += race_goals.goals(results)
    lines += race_report.misses(results, args.seeds)
    lines += ["Command:", "", "```", f"python bench/race.py {shlex.join(args.argv)}", "```", ""]
    return "\n".join(lines)


def combine(args, out: Path) -> None:
    """One report over earlier runs' race.json (each task's recipes timed in its own window).
    A task raced in several folders (``--runs autotune_steps`` apart from the others) is one
    task: the later folders add the contenders the first lacks (its default is the first's),
    and a note says their seconds per step were timed in another window (their steps, exact
    counts, compare as they are)."""
    results, frozen = [], None
    for folder in args.combine:
        data = json.loads((folder / "race.json").read_text())
        for result in data["results"]:
            merge_task(results, result, folder)
        frozen = frozen or data.get("frozen")
        args.seeds = data.get("seeds", args.seeds)
    write(out, report(results, args, frozen, 0.0), results, frozen, args.seeds)


def merge_task(results: list[dict], result: dict, folder: Path) -> None:
    """Add ``result`` to ``results``, into the task's earlier result when it has one."""
    same = next((r for r in results if r["task"] == result["task"]), None)
    if same is None:
        results.append(result)
        return
    have = {row["contender"] for row in same["rows"]}
    added = [row for row in result["rows"] if row["contender"] not in have]
    labels = {row["label"] for row in added}
    same["rows"] += added
    window = str(folder)  # their seconds per step: not paired with this task's rounds
    same["speed"].update(
        {k: {**v, "window": window} for k, v in result["speed"].items() if k in labels}
    )
    same["notes"] += result["notes"]
    if added:
        names = ", ".join(sorted({row["contender"] for row in added}))
        same["notes"].append(
            f"{names}: from {folder}, {OTHER_WINDOW} (its steps compare as they are)"
        )


def write(out: Path, text: str, results: list[dict], frozen, seeds) -> None:
    (out / "race.md").write_text(text)
    race_report.profile_png(results, out / "race_profile.png")
    (out / "race.json").write_text(
        json.dumps({"frozen": frozen, "seeds": seeds, "results": results}, default=str, indent=1)
    )
    print(text)
    print(f"written: {out / 'race.md'}, {out / 'race_profile.png'}, {out / 'race.json'}")


def main(argv=None) -> None:
    args = parse(argv)
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(args.out or tmp)
        out.mkdir(parents=True, exist_ok=True)
        if args.choose_targets:
            return race_targets.choose_targets(args.tasks, out / "targets")
        if args.combine:
            return combine(args, out)
        if args.remeasure:
            return remeasure(args, out)
        searches = any(r in SEARCHES for r in args.runs)
        frozen = frozen_settings(args) if searches or args.check else None
        found = race_tasks.problems(args.tasks, out, frozen, args.runs)
        if found:
            raise SystemExit("error: " + "; ".join(found))
        if args.check:
            print(f"{len(args.tasks)} task(s) and the search settings of {frozen['file']} check")
            return None
        results = [run_task(name, args, frozen, out / name) for name in args.tasks]
        text = report(results, args, frozen, time.monotonic() - started)
        write(out, text, results, frozen, args.seeds)
    return None


if __name__ == "__main__":
    main()
