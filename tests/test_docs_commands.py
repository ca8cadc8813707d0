"""Every command printed in the README and the sweep and autotune pages composes and passes the
run's checks as printed: a doc that falls behind the code (a renamed key, group or option) fails
here.

Each command's overrides are composed with Hydra's own parser, the ``hydra.*`` ones included
(launchers, sweepers and their settings must exist: Hydra composes the ``hydra`` node with
them, then drops it from the run's config), and every value of a sweep is checked as its job
would be (``tuneup.autotune.space.Checks``: the core's and every plugin's checks, nothing
built). One composition per job, shared by the commands that have it. The runs themselves
are in test_sweeps.py, test_sweep_presets.py and test_autotune.py.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import IntervalSweep

import tuneup
from tuneup.autotune.space import Checks

ROOT = Path(__file__).resolve().parents[1]
PAGES = ("README.md", "docs/sweeps.md", "docs/autotune.md")
PROGRAMS = (("python", "run.py"), ("tuneup",))
#: Presets an autotune writes or the user copies from it (test_autotune.py runs recipe.yaml).
MADE = ("experiment=recipe", "experiment=fast")


def documented_commands(page: str) -> list[str]:
    """The ``python run.py ...`` and ``tuneup ...`` commands in the page's code blocks
    (continuation lines joined) and inline code spans; placeholders (``<dir>``, ``...``), the
    user's own project's modules (tests/test_own_project.py runs those), presets made by an
    autotune and commands with flags (``--help``: not overrides) left out. A line whose words
    are not all overrides or flags is output shown beside the commands (``tuneup run
    summary: ok, ...``), not a command."""
    text = (ROOT / page).read_text()
    commands = []
    blocks = re.findall(r"^```[a-z]*\n(.*?)^```", text, flags=re.S | re.M)
    inline = re.findall(r"(?<!`)`((?:python run\.py|tuneup) [^`]+)`", text.replace("\n", " "))
    for block in [*blocks, *(f"{span} " for span in inline)]:
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #")[0].strip()
            if not re.match(r"([A-Z_]+=\S*\s+)*(python run\.py|tuneup)\s", line):
                continue
            words = shlex.split(line)
            while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):  # OMP_NUM_THREADS=4 ...
                words.pop(0)
            program = next((p for p in PROGRAMS if tuple(words[: len(p)]) == p), None)
            if program is None:
                continue
            if any("=" not in w and not w.startswith("-") for w in words[len(program) :]):
                continue  # output, e.g. the console's summary
            if any(
                "<" in w or w == "..." or w.startswith("--") or "my_project" in w or w in MADE
                for w in words
            ):
                continue
            commands.append(shlex.join(words))
    return commands


def overrides_of(command: str) -> list[str]:
    words = shlex.split(command)
    words = words[2:] if words[0] == "python" else words[1:]
    return [w for w in words if w != "-m"]


def jobs(overrides: list[str]) -> list[list[str]]:
    """The first job of the sweep, then each other value of each swept key on it."""
    parsed = OverridesParser.create().parse_overrides(overrides)
    choices = []
    for override in parsed:
        if not override.is_sweep_override():
            choices.append([override.input_line])
            continue
        key, value = override.get_key_element(), override.value()
        if isinstance(value, IntervalSweep):  # Optuna's interval(...): its ends
            values = [str(value.start), str(value.end)]
        else:
            values = list(override.sweep_string_iterator())
        choices.append([f"{key}={v}" for v in values])
    first = [options[0] for options in choices]
    found = [first]
    for i, options in enumerate(choices):
        found += [[*first[:i], other, *first[i + 1 :]] for other in options[1:]]
    return found


COMMANDS = [(page, command) for page in PAGES for command in documented_commands(page)]


def test_the_pages_hold_the_commands_this_test_checks():
    pages = {page for page, _ in COMMANDS}
    assert pages == set(PAGES)
    assert len(COMMANDS) >= 12, COMMANDS


#: Each job composed and checked once (a job's inspection is the same in every command).
CHECKS = Checks(tuneup.compose)


@pytest.mark.parametrize(("page", "command"), COMMANDS, ids=[c for _, c in COMMANDS])
def test_documented_command_composes_and_passes_the_checks(page, command):
    for job in jobs(overrides_of(command)):
        # composed with its hydra.* overrides: an unknown launcher, sweeper or setting of
        # theirs does not compose (Hydra applies them to its hydra node, then drops the node)
        problems = CHECKS.inspect(tuple(job)).problems
        assert not problems, f"{page}: `{command}` as job {job}: {problems}"
