"""A test that kills its pytest-xdist worker fails the suite at once and names the test.

pytest-xdist 3.8 under ``--dist loadfile`` (this suite's, pyproject.toml) deadlocks after it
replaces a crashed worker: the controller waits in ``DSession.loop_once``, the workers in
``TestQueue.get``, until CI's time limit (its issues 784 and 1378). The suite's options say
``--max-worker-restart=0``: no replacement, so no deadlock. Checked on a pytest of its own,
with this project's pytest options, over two files of trivial tests (no torch, no conftest,
no plugin but xdist: 1.5 CPU-seconds, not 5).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import pytest

from tests.conftest import ROOT

#: pytest-xdist's issue 784: two workers, three files, two of them killing their worker.
#: Under --dist loadfile with restarts (xdist's default: 4 per worker), it hung 3 times in 3.
KILLS = "import os\n\n\ndef test_fn():\n    os.kill(os.getpid(), 9)\n"
FILES = {
    "test_1_kill.py": KILLS,
    "test_2_no_kill.py": "def test_fn():\n    pass\n",
    "test_3_kill.py": KILLS,
}

#: Seconds the nested suite gets (it takes a few); past them it hangs, as on xdist's bug.
GUARD_S = 120


def test_a_worker_killed_by_its_test_fails_the_run_naming_the_test(tmp_path):
    for name, source in FILES.items():
        (tmp_path / name).write_text(source)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYTEST_XDIST", "PYTEST_ADDOPTS", "PYTEST_CURRENT"))
    }
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # hydra's and anyio's plugins: not needed here
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "xdist",
        "-c",
        str(ROOT / "pyproject.toml"),
        "--rootdir",
        str(tmp_path),
        "-p",
        "no:cacheprovider",
        *FILES,
    ]
    suite = subprocess.Popen(
        command,
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        process_group=0,
    )
    try:
        output, _ = suite.communicate(timeout=GUARD_S)
    except subprocess.TimeoutExpired:
        os.killpg(suite.pid, signal.SIGKILL)  # the controller and its workers
        output, _ = suite.communicate()
        pytest.fail(f"the suite hung after its worker crashed:\n{output[-3000:]}")
    assert suite.returncode == 1, output[-3000:]
    crashed = re.findall(
        r"worker 'gw\d' crashed while running '(test_\d_kill.py::test_fn)'", output
    )
    assert crashed, output[-3000:]  # one, or both if the other worker was in its kill already
    assert all(f"FAILED {test} - worker" in output for test in crashed)
    assert "crashed and worker restarting disabled" in output
    assert "replacing crashed worker" not in output
