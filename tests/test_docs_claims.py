"""What the docs state about the project holds (issue 25): each claim checked against what it
describes. The behaviour behind the sweeps page's claim is tests/test_run.py's
test_a_run_stopped_mid_epoch_by_max_steps_is_validated_at_its_last_step."""

from __future__ import annotations

import re

from tests.conftest import ROOT

DOCS = ROOT / "docs"
NUMBERS = {"two": 2, "three": 3, "four": 4, "five": 5, "six": 6}


def test_sweeps_page_says_a_run_stopped_mid_epoch_has_its_val_acc():
    text = " ".join((DOCS / "sweeps.md").read_text().split())
    assert "middle of an epoch has no val acc" not in text  # what it said, wrongly
    assert "stops in the middle of an epoch is validated once more at its last step" in text


def test_own_model_page_counts_the_files_it_lists():
    text = (DOCS / "your_own_model.md").read_text()
    heading = re.search(r"^## A project of (\w+) files\n+```\n(.*?)```", text, re.S | re.M)
    assert heading, "docs/your_own_model.md: no '## A project of N files' listing"
    listed = [line for line in heading.group(2).splitlines()[1:] if line.strip()]
    assert NUMBERS[heading.group(1)] == len(listed), listed


def test_readme_says_where_the_tests_real_slurm_comes_from():
    text = (ROOT / "README.md").read_text()
    before_test_command = " ".join(text.split("<!-- quickstart:test -->")[0].split()[-90:])
    assert "a real Slurm" in before_test_command
    assert "`.ci/run` installs first" in before_test_command
    assert "without it `tests/test_slurm.py` is skipped" in before_test_command
    slurm_setup = (ROOT / ".ci" / "run").read_text()
    assert "apt-get install" in slurm_setup and "slurmctld" in slurm_setup  # as it says


def test_checkpointing_page_says_when_the_first_resumed_step_is_shorter():
    """The behaviour: tests/test_elastic_resume.py counts each step's samples (a whole first
    step without accumulation, test_another_batch_on_processes_...) and each step's
    micro-batches (a shorter first one with it, test_another_global_batch_...)."""
    text = " ".join((DOCS / "checkpointing.md").read_text().split())
    assert "inside a step of that grid, the first step is shorter" not in text  # said wrongly
    assert ("With `grad_accum.steps=1` every step, the first included, is a whole global "
            "batch") in text  # fmt: skip
    assert "the first step has fewer micro-batches" in text
