"""Every command printed in README.md and in every page of docs/ composes and passes the run's
checks as printed: a doc that falls behind the code (a renamed key, group or option) fails here.

Each command's overrides are composed with Hydra's own parser, the ``hydra.*`` ones included
(launchers, sweepers and their settings must exist: Hydra composes the ``hydra`` node with
them, then drops it from the run's config), and every value of a sweep is checked as its job
would be (``tuneup.autotune.space.Checks``: the core's and every plugin's checks, nothing
built); a single run's command also as its command line is (a setting of a plugin that is
off). One check per job, in one process, shared by the commands that have it; the jobs of
one set of config groups composed on one composition of those groups, their values applied
by Hydra's own function (:class:`tests.compositions.Composer`, the study's own composer), as Hydra composes a job. The
commands run in a user's project as the pages build it: docs/your_own_model.md's
``my_project`` and docs/tutorial.md's ``stripes``, their files as printed, so the commands
of those pages compose with the user's own modules and presets.

What cannot pass here is listed below with the reason (:data:`NOT_CHECKED`: composed, not
checked; :data:`REFUSED`: shown as an error, so it must be refused). The runs themselves are in
test_sweeps.py, test_sweep_presets.py, test_autotune.py, test_own_project.py and the pages'
own tests.
"""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import IntervalSweep

import tuneup
from tests.compositions import Composer
from tests.own_project import blocks, write_project
from tuneup.autotune.space import Checks
from tuneup.trainer.checks import inert_problems

ROOT = Path(__file__).resolve().parents[1]
PAGES = ("README.md", *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")))
PROGRAMS = (("python", "run.py"), ("tuneup",))
#: Presets an autotune writes or the user copies from it (test_autotune.py runs recipe.yaml).
MADE = ("experiment=recipe", "experiment=fast")
#: The user's packages the pages build (their modules are dropped after this file's tests).
PACKAGES = ("my_project", "stripes")

#: Commands that compose here but whose checks need what this machine or checkout lacks: a
#: part of the command (matched as a substring) and why. They are still composed by Hydra.
NOT_CHECKED = {
    "precision=fp8": "needs a GPU with float8 tensor cores",
    "optimizer.fused=true": "Triton's fused LAMB/LARS needs CUDA",
    "kernels.backend=liger": "Liger-Kernel's Triton kernels need CUDA",
    "data.root=/data/imagenet": "the user's ImageNet folder",
    "data.root=cifar10": "the user's CIFAR-10 image folder",
    "data=imagefolder data.image_size=192": "an image folder of the user's (data.root)",
    "data.path=input.txt": "the user's text file",
    "data.path=/data/imagenet-shards": "shards the user wrote with tuneup-shards",
    "data.path=/data/text-shards": "shards the user wrote with tuneup-shards",
    "model.path=/models/my-gpt2": "the user's pretrained model directory",
    "model.path=tiny-llama": "docs/distributed.md's fine-tuning project (test_docs_finetune.py)",
    "resume=auto hydra.run.dir=outputs/ft": "continues the run in outputs/ft with its own "
    "settings (test_docs_finetune.py)",
    "model.path=/models/my-llama": "the user's pretrained model directory",
    "plugins.disable=[gradnorm]": "an always-on plugin the user installed (gradnorm)",
}
#: Commands of a config group this install lacks, not composed: a part of the command and why.
ELSEWHERE = {
    "polyak=on": "docs/plugins.md's installable plugin's own group (test_docs_example.py)",
}
#: Commands a page shows as errors: each must be refused (its message: test_config_errors.py
#: and test_newcomer.py).
REFUSED = {
    "tuneup data.batch_size=0": "a config error's start-up time",
    "tuneup precison=bf16": "a mistyped group",
    "tuneup precision=fp61": "a mistyped option",
    "tuneup +precison=bf16": "a mistyped group added with +",
    "tuneup 'modle.hidden=[32]'": "a mistyped group's setting",
    "tuneup ema=off ema.decay=0.9": "a setting of a plugin that is off, in a single run",
    "model=mlp memory_format=channels_last": "channels_last on a model without convolutions",
}


def documented_commands(page: str) -> list[str]:
    """The ``python run.py ...`` and ``tuneup ...`` commands in the page's code blocks
    (continuation lines joined) and inline code spans; placeholders (``<dir>``, ``...``),
    presets made by an autotune and commands with flags (``--help``, ``--config-dir``: not
    overrides) left out. A line whose words are not all overrides or flags is output shown
    beside the commands (``tuneup run summary: ok, ...``), not a command."""
    text = (ROOT / page).read_text()
    commands = []
    blocks_ = re.findall(r"^```[a-z]*\n(.*?)^```", text, flags=re.S | re.M)
    inline = re.findall(r"(?<!`)`((?:python run\.py|tuneup) [^`]+)`", text.replace("\n", " "))
    for block in [*blocks_, *(f"{span} " for span in inline)]:
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #")[0].strip().removeprefix("$ ")
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
            if any("<" in w or w == "..." or w.startswith("--") or w in MADE for w in words):
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


def listed(command: str, table: dict[str, str]) -> str | None:
    return next((part for part in table if part in command), None)


COMMANDS = [(page, command) for page in PAGES for command in documented_commands(page)]


#: Each job composed and checked once (a job's inspection is the same in every command).
CHECKS = Checks(Composer())


@pytest.fixture(scope="module", autouse=True)
def project(tmp_path_factory):
    """The user's project the pages build, as the working directory of every composition:
    docs/your_own_model.md's files (with the tests' extra modules) and docs/tutorial.md's."""
    folder = write_project(tmp_path_factory.mktemp("project"))
    for name, text in blocks(ROOT / "docs" / "tutorial.md").items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    (folder / "stripes" / "__init__.py").touch()
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        patch.syspath_prepend(str(folder))
        yield folder
    for name in [m for m in sys.modules if m.split(".")[0] in PACKAGES]:
        del sys.modules[name]  # another test's project of the same name imports its own


def test_every_page_is_read_and_every_listed_command_is_shown():
    pages = {page for page, _ in COMMANDS}
    assert {"README.md", "docs/tutorial.md", "docs/your_own_model.md"} <= pages
    assert len(COMMANDS) >= 100, COMMANDS
    shown = " ".join(command for _, command in COMMANDS)
    stale = [part for part in [*NOT_CHECKED, *ELSEWHERE, *REFUSED] if part not in shown]
    assert not stale, f"listed here, shown nowhere: {stale}"


def problems_of(command: str, job: list[str]) -> list[str]:
    """What the run (a single run: also its command line) would refuse in this job."""
    inspection = CHECKS.inspect(tuple(job))
    found = list(inspection.problems)
    if not found and " -m " not in f"{command} ":
        found += inert_problems(inspection.config, job)
    return found


@pytest.mark.parametrize(("page", "command"), COMMANDS, ids=[c for _, c in COMMANDS])
def test_documented_command_composes_and_passes_the_checks(page, command):
    if listed(command, ELSEWHERE):
        pytest.skip(ELSEWHERE[listed(command, ELSEWHERE)])
    for job in jobs(overrides_of(command)):
        # composed with its hydra.* overrides: an unknown launcher, sweeper or setting of
        # theirs does not compose (Hydra applies them to its hydra node, then drops the node)
        if listed(command, NOT_CHECKED):
            tuneup.compose(job)
            continue
        problems = problems_of(command, job)
        if listed(command, REFUSED):
            assert problems, f"{page}: `{command}` is shown as refused, and it is not"
        else:
            assert not problems, f"{page}: `{command}` as job {job}: {problems}"
