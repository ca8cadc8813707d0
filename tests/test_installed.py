"""tuneup installed with ``pip install .`` (not editable), run from a directory of the user's that
holds its own trainer.py, plugins/ and conf/: nothing of theirs shadows tuneup's, their conf/
adds presets, and errors are one line on the console with the whole traceback in the log file."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, TINY, python

PRESET = """
    # @package _global_
    model:
      width: 4
    trainer:
      max_steps: 3
"""
BOMB = """
    from tuneup import hookimpl

    class Plugin:
        @hookimpl
        def on_train_batch_end(self, batch_idx):
            if batch_idx == 1:
                raise RuntimeError("boom in batch 1")
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A site folder holding tuneup built and installed from this checkout, not editable.

    Built from a copy of the sources: pip builds in the source folder, and a stale build/
    left in the checkout would end up in later builds."""
    source, site = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("site")
    ignore = shutil.ignore_patterns(
        ".*", "__pycache__", "*.egg-info", "build", "outputs", "multirun", "tests", "bench"
    )
    shutil.copytree(ROOT, source, ignore=ignore, dirs_exist_ok=True)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            "--no-build-isolation",
            "--target",
            str(site),
            str(source),
        ],
        check=True,
        capture_output=True,
    )
    return site


@pytest.fixture
def foreign(tmp_path) -> Path:
    """A user's project whose names would collide with tuneup's folders if they leaked."""
    (tmp_path / "trainer.py").write_text("raise SystemExit('the user trainer.py was imported')\n")
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / "__init__.py").write_text("raise SystemExit('user plugins imported')\n")
    (tmp_path / "conf" / "experiment").mkdir(parents=True)
    (tmp_path / "conf" / "experiment" / "quick.yaml").write_text(textwrap.dedent(PRESET))
    return tmp_path


def command(installed: Path, cwd: Path, *args: str, extra_path=(), cold=False, **environment):
    """The installed console script, as its own interpreter (``cold``: --help's start-up is
    timed) or as a warm start of the same script (tests/warm.py: the training runs)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(installed), *map(str, extra_path)]),
        "PYTHONUNBUFFERED": "1",
        **environment,
    }
    script = [str(installed / "bin" / "tuneup"), *args]
    return subprocess.run(
        script if cold else [*python(), *script],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_command_runs_from_a_foreign_directory(installed, foreign):
    found = subprocess.run(
        [sys.executable, "-c", "import tuneup, tuneup.trainer; print(tuneup.trainer.__file__)"],
        cwd=foreign,
        env={**os.environ, "PYTHONPATH": str(installed)},
        capture_output=True,
        text=True,
        check=True,
    )
    assert found.stdout.startswith(str(installed))  # the installed copy, not the checkout

    started = time.perf_counter()
    help_text = command(installed, foreign, "--help", cold=True)
    assert help_text.returncode == 0 and time.perf_counter() - started < 30
    assert (
        "precision" in help_text.stdout and "experiment                 quick" in help_text.stdout
    )

    result = command(installed, foreign, *TINY, "experiment=quick")
    assert result.returncode == 0, result.stderr[-3000:]
    (run_dir,) = (foreign / "outputs").glob("*/*")  # Hydra's run directory, under the cwd
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["steps"] == 3  # the user's preset applied

    module = subprocess.run(
        [sys.executable, "-m", "tuneup", "--help"],
        cwd=foreign,
        env={**os.environ, "PYTHONPATH": str(installed)},
        capture_output=True,
        text=True,
    )
    assert module.returncode == 0 and module.stdout == help_text.stdout


def test_a_failing_hook_is_one_line_here_and_a_traceback_in_the_log(installed, foreign, tmp_path):
    site = tmp_path / "bomb-site"
    site.mkdir()
    (site / "tuneup_bomb.py").write_text(textwrap.dedent(BOMB))
    info = site / "tuneup_bomb-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tuneup-bomb\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[tuneup]\nbomb = tuneup_bomb:Plugin\n")
    run_dir = tmp_path / "run"
    args = (*TINY, f"hydra.run.dir={run_dir}")

    result = command(installed, foreign, *args, extra_path=[site])
    assert result.returncode == 1
    message = (
        "error: plugin 'bomb' failed in hook 'on_train_batch_end': RuntimeError: boom in batch 1"
    )
    assert result.stderr.strip().splitlines()[-1] == message
    assert "Traceback" not in result.stderr
    log = (run_dir / "tuneup.log").read_text()
    assert "Traceback" in log and 'raise RuntimeError("boom in batch 1")' in log

    loud = command(
        installed, foreign, *args, "resume=null", extra_path=[site], HYDRA_FULL_ERROR="1"
    )
    assert loud.returncode == 1 and "Traceback" in loud.stderr
