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
