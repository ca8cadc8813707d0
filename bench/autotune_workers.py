"""``autotune.workers=2`` against ``workers=1`` on one study, paired in one window (issue 48).

For each sampler seed (``autotune.sampler_seed``), the same time-to-target study on digits
(docs/autotune.md's command, ``autotune.stages=[study]``, ``autotune.budget_trials=N`` and a
``budget_minutes`` that does not bind) runs twice, back to back, the order alternating from
seed to seed (W1 W2, W2 W1, W1 W2):

- ``W1``: ``autotune.workers=1``, the basic launcher, one trial at a time with every core;
- ``W2``: ``autotune.workers=2 hydra/launcher=joblib hydra.launcher.n_jobs=2``, two trials
  at once, cores / 2 threads each (the autotune sets ``OMP_NUM_THREADS`` per job).

Per sweep: the explore stage's wall seconds (the study's first trial's start to its last
one's end, from the study's journal), the whole sweep's (the command's wall time), the
study's trials, the threads its runs had, and its pick with its estimated time to target
(autotune.json). Over the seeds: W2/W1 wall time, the geometric mean of the pairs with its
Student's t interval on the log scale (tuneup/stats/interval.py ``paired``), and each arm's
median estimated time to target of its picks. The goals (issue 48): W2 at most 0.65x W1's
explore wall time with the same trial count, and W2's median pick no slower than W1's.
Prints Markdown for docs/benchmarks.md and writes autotune_workers.json to ``--out``.

    python bench/autotune_workers.py --out workers-out         # seeds 0 1 2, 40 trials: 6 sweeps
    python bench/autotune_workers.py --seeds 0 --trials 4      # the pipeline, quickly
    python bench/autotune_workers.py --task digits_conv --out conv-out   # a race task's command
    python bench/autotune_workers.py --report workers-out      # the tables again, nothing run
    python bench/autotune_workers.py --remeasure workers-out   # the picks timed in one window

``--remeasure DIR``: each search timed its pick in its own window, so the arms' estimates are
not paired. This times every distinct pick and the command (the reference) in one window
(bench/race_speed.py ``measure``: interleaved rounds of trials), then a pick's time to target
is its median steps to target on its confirmation's seeds (``pick.steps``: autotune.json's
confirmed row's ``steps_to_target``, exact counts) x its seconds per step from that window.
The figures go into DIR's autotune_workers.json under ``remeasured``.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]

import autotune_sweep as sw  # noqa: E402
from autotune_remeasure import remeasure, remeasured_report  # noqa: E402

from tuneup.stats.interval import paired  # noqa: E402

#: Issue 48's goal: W2's explore wall time over W1's, at most.
GOAL_RATIO = 0.65
FILE_NAME = "autotune_workers.json"


def parse(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="sampler seeds")
    parser.add_argument("--trials", type=int, default=40, help="autotune.budget_trials")
    parser.add_argument(
        "--minutes", type=float, default=120, help="autotune.budget_minutes (not to bind)"
    )
    parser.add_argument("--workers", type=int, default=2, help="the parallel arm's workers")
    parser.add_argument(
        "--task",
        default="digits",
        help="digits (docs/autotune.md's command) or a task of bench/race_tasks.py (its command)",
    )
    parser.add_argument("--out", type=Path, default=Path("autotune-workers-out"))
    parser.add_argument("--extra", nargs="*", default=[], help="more overrides for every sweep")
    parser.add_argument(
        "--report", action="store_true", help="no run: the tables from --out's JSON"
    )
    parser.add_argument(
        "--remeasure",
        type=Path,
        metavar="DIR",
        help="no sweep: DIR's picks and command timed in one window (their time to target)",
    )
    parser.add_argument("--rounds", type=int, default=5, help="--remeasure: interleaved rounds")
    parser.add_argument("--steps", type=int, default=512, help="--remeasure: steps per trial")
    return parser.parse_args(argv)


def arms(workers: int) -> dict[str, list[str]]:
    """The two arms' own overrides: one worker with the machine, ``workers`` on joblib."""
    return {
        "W1": ["autotune.workers=1"],
        f"W{workers}": [
            f"autotune.workers={workers}",
            "hydra/launcher=joblib",
            f"hydra.launcher.n_jobs={workers}",
        ],
    }


def plan(seeds: list[int], names: list[str]) -> list[tuple[int, str]]:
    """(seed, arm) in run order: the arms' order reversed from one seed to the next."""
    return [(seed, name) for i, seed in enumerate(seeds) for name in names[:: -1 if i % 2 else 1]]


def task_command(task: str, folder: Path) -> list[str]:
    """The study's command: docs/autotune.md's digits command, or a race task's."""
    if task == "digits":
        return list(sw.DIGITS)
    import race_tasks

    if task not in race_tasks.TASKS:
        raise SystemExit(
            f"error: --task={task} is not a task; choose digits or one of: "
            + ", ".join(sorted(race_tasks.TASKS))
        )
    return ["experiment=autotune", "autotune.objective=time_to_target",
            *race_tasks.command(task, folder)]  # fmt: skip


def overrides(args, arm: list[str], seed: int) -> list[str]:
    return [
        *task_command(getattr(args, "task", "digits"), args.out),
        "autotune.stages=[study]",
        f"autotune.budget_trials={args.trials}",
        f"autotune.budget_minutes={args.minutes:g}",
        f"autotune.sampler_seed={seed}",
        *arm,
        *args.extra,
    ]


def result(arm: str, seed: int, done: dict) -> dict:
    """One sweep's figures (``done``: autotune_sweep.sweep's)."""
    record = done["record"]
    found = {
        "arm": arm,
        "seed": seed,
        "command": done["command"],
        "wall_s": done["wall_s"],
        "folder": done["folder"],
    }
    if done["returncode"] or record is None:
        return {**found, "error": sw.failure(done["folder"])}
    return {
        **found,
        "elapsed_s": record.get("elapsed_seconds"),
        "explore_s": sw.explore_seconds(sw.journal_times(record)),
        "trials": sw.study_trials(record),
        "devices": sorted({t["device"] for t in record.get("trials") or [] if t.get("device")}),
        "pick": sw.pick(record),
    }


def ratio(rows: list[dict], key: str, one: str, many: str) -> dict | None:
    """``many`` / ``one`` of ``key`` over the seeds both ran: the geometric mean of the pairs
    and its t interval on the log scale."""
    pairs = [(r[one].get(key), r[many].get(key)) for r in rows if one in r and many in r]
    pairs = [(a, b) for a, b in pairs if a and b]
    if not pairs:
        return None
    found = paired([a for a, _ in pairs], [b for _, b in pairs], 0.95)
    high = found.high if found.high != float("inf") else None
    return {"estimate": found.estimate, "low": found.low, "high": high, "pairs": len(pairs)}


def by_seed(results: list[dict]) -> list[dict]:
    """``[{"seed": 0, "order": ["W1", "W2"], "W1": {...}, "W2": {...}}, ...]`` in run order."""
    rows: dict[int, dict] = {}
    for found in results:
        row = rows.setdefault(found["seed"], {"seed": found["seed"], "order": []})
        row["order"].append(found["arm"])
        row[found["arm"]] = found
    return list(rows.values())


_s, _s3 = sw.one_decimal, sw.seconds


def _x(found: dict | None) -> str:
    if not found:
        return "-"
    high = "inf" if found["high"] is None else f"{found['high']:.2f}"
    return f"{found['estimate']:.2f}x [{found['low']:.2f}, {high}]"


def _pick(found: dict) -> str:
    if "error" in found:
        return f"failed: {found['error']}"
    p = found["pick"]
    what = " ".join(p["overrides"]) or "your command kept"
    seconds = "-" if p["seconds"] is None else f"{p['seconds']:.3f} s"
    steps = "-" if p["steps"] is None else f"{p['steps']:g}"
    return f"{seconds} ({steps} steps; `{what}`)"


def table(results: list[dict], one: str, many: str) -> str:
    """The pairs, one row a seed, then the ratios and each arm's median pick."""
    rows = by_seed(results)
    lines = [
        f"| sampler seed | order | explore s {one} / {many} | ratio | sweep s {one} / {many} "
        f"| study trials {one} / {many} | {one}'s pick: estimated time to target | "
        f"{many}'s pick |",
        "|---:|---|---:|---:|---:|---:|---|---|",
    ]
    for row in rows:
        a, b = row.get(one, {}), row.get(many, {})
        explore = f"{_s(a.get('explore_s'))} / {_s(b.get('explore_s'))}"
        single = ratio([row], "explore_s", one, many)
        sweeps = f"{_s(a.get('wall_s'))} / {_s(b.get('wall_s'))}"
        trials = " / ".join(sw.trials_text(x.get("trials") or {}) for x in (a, b))
        lines.append(
            f"| {row['seed']} | {' '.join(row['order'])} | {explore} | "
            f"{'-' if single is None else format(single['estimate'], '.2f')} | {sweeps} | "
            f"{trials} | {_pick(a) if a else '-'} | {_pick(b) if b else '-'} |"
        )
    lines.append("")
    lines.append(f"- explore stage, {many} / {one}: {_x(ratio(rows, 'explore_s', one, many))}")
    lines.append(f"- whole sweep, {many} / {one}: {_x(ratio(rows, 'wall_s', one, many))}")
    for arm in (one, many):
        picks = [r[arm]["pick"]["seconds"] for r in rows if "pick" in r.get(arm, {})]
        devices = sorted({d for r in rows for d in r.get(arm, {}).get("devices", [])})
        lines.append(
            f"- {arm}: median estimated time to target of its picks {_s3(sw.median(picks))} "
            f"over {len([p for p in picks if p is not None])} search(es); runs on {', '.join(devices) or '-'}"
        )
    return "\n".join(lines)


def goals(results: list[dict], one: str, many: str) -> list[str]:
    """Issue 48's two goals, each ``met`` or ``NOT met`` with its figures."""
    rows = by_seed(results)
    complete = [r for r in rows if "pick" in r.get(one, {}) and "pick" in r.get(many, {})]
    lines = []
    speed = ratio(complete, "explore_s", one, many)
    counts = [(r["seed"], sw.ran(r[one]["trials"]), sw.ran(r[many]["trials"])) for r in complete]
    fewer = [f"seed {seed}: {b} against {a}" for seed, a, b in counts if b < a]
    more = [f"seed {seed}: {b} against {a}" for seed, a, b in counts if b > a]
    if speed is None:
        verdict = "not measured (no pair of sweeps finished)"
    elif fewer:
        verdict = f"NOT met: {many} ran fewer study trials ({'; '.join(fewer)})"
    else:
        met = speed["estimate"] <= GOAL_RATIO
        beyond = speed["high"] is not None and speed["high"] <= GOAL_RATIO
        verdict = (
            f"{'met' if met else 'NOT met'} ({_x(speed)} over {speed['pairs']} pairs; "
            f"the interval {'below' if beyond else 'reaches above'} {GOAL_RATIO})"
        )
        if more:
            verdict += f"; {many} ran more study trials ({'; '.join(more)})"
    lines.append(
        f"- {many} finishes the same study in at most {GOAL_RATIO}x {one}'s explore wall time: "
        f"{verdict}"
    )
    medians = {arm: sw.median(r[arm]["pick"]["seconds"] for r in complete) for arm in (one, many)}
    if None in medians.values():
        verdict = "not measured (no estimated time to target)"
    else:
        met = medians[many] <= medians[one]
        steps = {arm: sw.median(r[arm]["pick"]["steps"] for r in complete) for arm in (one, many)}
        verdict = (
            f"{'met' if met else 'NOT met'} ({_s3(medians[many])} against {_s3(medians[one])}, "
            f"medians over {len(complete)} search(es) each; steps to target "
            f"{_s(steps[many])} against {_s(steps[one])})"
        )
    lines.append(f"- {many}'s pick: median time to target no worse than {one}'s: {verdict}")
    broken = [str(r["seed"]) for r in rows if r not in complete]
    if broken:
        lines.append(
            f"- not judged: sampler seed(s) {', '.join(broken)} (a sweep failed or is missing)"
        )
    return lines


def commands(results: list[dict]) -> list[str]:
    """Each arm's command, once (its first seed's), for the report's code block."""
    first: dict[str, str] = {}
    for found in results:
        first.setdefault(found["arm"], " ".join(shlex.quote(a) for a in found["command"]))
    return [f"{command}  # {arm}" for arm, command in first.items()]


def report(data: dict) -> str:
    one, many = data["arms"]
    return "\n".join(
        [
            f"Task {data.get('task', 'digits')}; "
            f"{len(data['seeds'])} sampler seeds, autotune.budget_trials={data['trials']}, "
            f"autotune.stages=[study], each pair of sweeps back to back:\n",
            "```",
            *commands(data["results"]),
            "```",
            "",
            table(data["results"], one, many),
            "",
            "**Goals** (issue 48):",
            "",
            *goals(data["results"], one, many),
        ]
    )


def main(argv=None) -> None:
    args = parse(argv)
    if args.remeasure:
        print(remeasured_report(remeasure(args.remeasure / FILE_NAME, args.rounds, args.steps)))
        print(f"\n{args.remeasure / FILE_NAME}", file=sys.stderr)
        return
    path = args.out / FILE_NAME
    if args.report:
        data = json.loads(path.read_text())
        print(report(data))
        if "remeasured" in data:  # kept by an earlier --remeasure
            print("\n" + remeasured_report(data))
        return
    named = arms(args.workers)
    data = {
        "seeds": args.seeds,
        "trials": args.trials,
        "task": args.task,
        "arms": list(named),
        "results": [],
    }
    env = sw.clean_env()
    runs = plan(args.seeds, list(named))
    sw.fresh([args.out / f"seed{seed}-{arm}" for seed, arm in runs])
    for seed, arm in runs:
        done = sw.sweep(overrides(args, named[arm], seed), args.out / f"seed{seed}-{arm}", env)
        data["results"].append(result(arm, seed, done))
        args.out.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=1))  # each sweep kept as it ends
        print(f"seed {seed} {arm}: {done['wall_s']:.1f} s", file=sys.stderr)
    print(report(data))
    print(f"\n{path}", file=sys.stderr)


if __name__ == "__main__":
    main()
