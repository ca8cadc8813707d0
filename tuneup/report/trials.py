"""The report of an autotune's trials: one folder, one answer.

An autotune (``tuneup -m experiment=autotune``) writes its answer into the sweep directory:
autotune.md, recipe.yaml, autotune.json. Its trials are ordinary jobs of the sweep, so the
sweep report lists them too; were it to name a "best" trial (one run's samples/s or wall
time) and a command that starts the search again, the folder would hold two answers, and
the report's would be the one the autotune's interleaved rounds or paired seeds had found
not significant. So for an autotune the report names no best: its first lines say that it
lists the trials, point to autotune.md and the full run the autotune chose, and give the
command that runs one trial again on its own.
"""

from __future__ import annotations

import json
import shlex

from tuneup.report.comparison import Report
from tuneup.report.runs import Run

ANSWER, RECORD = "autotune.md", "autotune.json"
#: Settings that steer the search, not a trial: a trial run again on its own leaves them out.
SEARCH_KEYS = ("autotune", "report")


def trials_heading(report: Report) -> list[str]:
    """report.md's first lines for an autotune: what it lists, where the answer is, and the
    command that runs a trial again."""
    from tuneup.report.cells import code

    trial = report.baseline
    return [
        f"# Trials of an autotune: {report.directory.name}",
        "",
        answer_line(report),
        "",
        f"This report lists the autotune's {len(report.runs)} trials (the short runs its search "
        "launched) and ranks none of them: one trial's samples/s or time to target decides "
        "nothing, autotune.md compares them interleaved (speed) or on paired seeds (time to "
        "target).",
        "",
        f"Run one trial again on its own (a single run, not the search): "
        f"{code(trial_command(trial))} (trial {trial.name}); another trial: the same with its "
        "own overrides (the table's overrides column) in place of this one's.",
    ]


def answer_line(report: Report) -> str:
    """Where the answer is, with the full run autotune.json records (absent: the search did
    not finish, and its console said why)."""
    from tuneup.report.cells import code

    path = report.directory / RECORD
    try:
        recipe = json.loads(path.read_text()).get("recipe") or {}
    except (OSError, ValueError):
        return (
            f"**The answer is [{ANSWER}]({ANSWER})**: not written here, the search did not "
            "finish (its console says why)."
        )
    found = recipe.get("found")
    facts = (
        []
        if found is None
        else [f"the recipe {code(' '.join(found))}" if found else "your command as it is"]
    )
    if recipe.get("command"):
        facts.append(f"the full run: {code(recipe['command'])}")
    return f"**The answer is [{ANSWER}]({ANSWER})**" + (f": {'; '.join(facts)}." if facts else ".")


def trial_command(run: Run) -> str:
    """The command that trains ``run`` again as a single run: its overrides without the
    search's own settings (``experiment=autotune``, ``autotune.*``, ``report.*``), which
    change nothing a trial trains."""
    ran = (run.summary or {}).get("command") or "python run.py"
    kept = [o for o in run.overrides if not _steers_search(o)]
    return " ".join([ran, *map(shlex.quote, kept)])


def _steers_search(override: str) -> bool:
    key, _, value = override.lstrip("+~").partition("=")
    return (key, value) == ("experiment", "autotune") or key.split(".")[0] in SEARCH_KEYS
