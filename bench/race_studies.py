"""What each search's study found, TPE against random search: counts read from a race's folder.

bench/race.py runs 3 searches per task and search contender (``autotune``: TPE; ``random``:
random draws, the same trials, budget, pruner and confirmation) into
``<out>/<task>/<task>/<contender><i>/``. The race itself scores each search's pick on unseen
seeds; this reads what the study behind each pick found, from its autotune.json (``explore``:
every study trial with its cost to target, the command's trial first): its completed trials,
how many reached the target in under half the command's cost (in the study's own
``autotune.cost``), and its best trial's cost as a share of the command's. These are exact
counts on the study's seed, not the pick's figure on new seeds. Prints Markdown.

    python bench/race_studies.py /work/race-out --tasks digits digits_conv
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

CONTENDERS = ("random", "autotune")


def study_counts(path: Path) -> dict | None:
    """One search's study: completed trials, those under half the command's cost, the best
    trial's cost over the command's; None where the search left no autotune.json."""
    if not path.exists():
        return None
    explore = json.loads(path.read_text())["explore"]
    base = next(t["value"] for t in explore if t.get("baseline"))
    costs = [
        t["value"]
        for t in explore
        if t["state"] == "COMPLETE" and not t.get("baseline") and _finite(t.get("value"))
    ]
    return {
        "complete": len(costs),
        "under_half": sum(c < base / 2 for c in costs),
        "best": min(costs) / base if costs and _finite(base) else None,
    }


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def table(out: Path, tasks: list[str], searches: int = 3) -> str:
    lines = [
        "| task | search | completed trials (each search) | under half the command's cost "
        "(each; median) | best trial / the command (each; median) |",
        "|---|---|---|---|---|",
    ]
    for task in tasks:
        for contender in CONTENDERS:
            found = [
                study_counts(out / task / task / f"{contender}{i}" / "autotune.json")
                for i in range(searches)
            ]
            found = [f for f in found if f]
            if not found:
                continue
            under = [f["under_half"] for f in found]
            best = [f["best"] for f in found if f["best"] is not None]
            lines.append(
                f"| {task} | {contender} | {', '.join(str(f['complete']) for f in found)} | "
                f"{', '.join(map(str, under))}; {statistics.median(under):g} | "
                f"{', '.join(f'{b:.2f}' for b in best)}; "
                f"{statistics.median(best):.2f} |"
                if best
                else f"| {task} | {contender} | - | - | - |"
            )
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="a bench/race.py --out folder (or several tasks')")
    parser.add_argument("--tasks", nargs="+", help="default: every task folder in it")
    args = parser.parse_args(argv)
    tasks = args.tasks or sorted(
        p.name for p in args.out.iterdir() if (p / p.name).is_dir() and p.name != "all"
    )
    print(table(args.out, tasks))


if __name__ == "__main__":
    main()
