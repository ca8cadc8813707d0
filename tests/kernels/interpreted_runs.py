"""The Triton interpreter's test runs of test_triton_kernels.py, started with the session.

``TRITON_INTERPRET=1`` must be set before the kernels are imported, so the interpreted tests
(test_interpreted_kernels.py, and test_interpreted_bench.py: ``bench/kernels.py --smoke``)
run in pytest subprocesses: under the installed Triton, and under the oldest one the
``kernels`` extra allows (pip-installed into pytest's cache: tests/kernels/oldest_triton.py).
With pip they take 35 to 40 CPU-seconds and never wait, while the suite's workers left the
cores idle for 30 to 38 core-seconds of a run (a Slurm job's requeue, runs killed and resumed,
the last file). tests/conftest.py starts them with the session (``python -m
tests.kernels.interpreted_runs FOLDER CACHE_DIR VERSION``) at the lowest priority: they take
what the workers leave (the idle cores: 9 core-seconds left in a run, from 23 to 38), and the
test file reads their results from FOLDER, waiting for what is not done. Standard library
only: it must start in milliseconds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

from tests.kernels.oldest_triton import install, oldest_supported_triton

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
#: The test file that reads their results (tests/conftest.py starts them where it is selected).
TEST_FILE = HERE / "test_triton_kernels.py"

#: Where the session's runs write (set by tests/conftest.py for the workers).
FOLDER_VARIABLE = "TUNEUP_TEST_INTERPRETED"
#: The file written last, when every run has ended: ``{name: [returncode, output]}``, the
#: oldest version and pip's error ("" when it installed).
RESULTS = "results.json"


def start_interpreted_tests(
    triton_version: str, triton_path: Path | None = None
) -> subprocess.Popen:
    """test_interpreted_kernels.py and test_interpreted_bench.py in a subprocess, under the
    Triton at triton_path if given (which must be `triton_version`: the subprocess checks).
    Under the oldest Triton only the kernels' own tests run: opcheck, torch.compile and the
    bench do not depend on Triton's version, the two 12-step training runs use the kernels
    compared op by op already (half of the time), and Liger-Kernel's kernels are Liger's to
    keep working with old Tritons."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}  # 2 runs share cores
    env["TUNEUP_EXPECT_TRITON"] = triton_version
    if triton_path is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(triton_path), env.get("PYTHONPATH", "")])
    command = [
        sys.executable,
        "-m",
        "pytest",
        str(HERE / "test_interpreted_kernels.py"),
        "-q",
        "-rp",
        "-x",
        "-p",
        "no:cacheprovider",
        "-n",
        "0",
    ]
    if triton_path is None:
        command.append(str(HERE / "test_interpreted_bench.py"))
    else:
        command += ["-k", "not training_losses and not opcheck and not compiled and not liger"]
    return subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def run_all(folder: Path, cache_dir: Path, installed_version: str) -> dict:
    """Both runs, the installed Triton's while pip installs the oldest; their results written
    to ``folder/RESULTS`` (whole: written beside it, then renamed) and returned."""
    runs = {"installed": start_interpreted_tests(installed_version)}
    oldest = oldest_supported_triton()
    old_path, pip_error = install(oldest, cache_dir)
    if old_path is not None:
        runs["oldest"] = start_interpreted_tests(oldest, old_path)
    outputs = {name: process.communicate(timeout=900)[0] for name, process in runs.items()}
    results = {name: [runs[name].returncode, output] for name, output in outputs.items()}
    return write(folder, results | {"oldest_version": oldest, "pip_error": pip_error})


def write(folder: Path, results: dict) -> dict:
    """``results`` as ``folder/RESULTS``, whole or not at all (a reader polls for it)."""
    folder.mkdir(parents=True, exist_ok=True)
    partial = folder / f"{RESULTS}.partial"
    partial.write_text(json.dumps(results))
    os.rename(partial, folder / RESULTS)
    return results


def start_in_background(folder: Path, cache_dir: Path, triton_version: str) -> subprocess.Popen:
    """This module as a script, at the lowest priority, in a process group of its own (not a
    session: Linux schedules each session as a group of its own, with as much CPU as all the
    suite's processes together, whatever its nice value; measured, the first runs took a
    whole core from the workers)."""
    command = [
        sys.executable,
        "-m",
        "tests.kernels.interpreted_runs",
        str(folder),
        str(cache_dir),
        triton_version,
    ]
    return subprocess.Popen(
        command,
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        process_group=0,
        preexec_fn=lambda: os.nice(19),
    )


def wait_for(folder: Path, timeout: float = 1200) -> dict:
    """The results the background runs write to ``folder``, once they are there."""
    deadline = time.monotonic() + timeout
    while not (folder / RESULTS).is_file():
        if time.monotonic() > deadline:
            raise TimeoutError(f"the interpreted test runs wrote no {folder / RESULTS}")
        time.sleep(0.2)
    results = json.loads((folder / RESULTS).read_text())
    if "error" in results:
        raise RuntimeError(f"the interpreted test runs failed to run:\n{results['error']}")
    return results


if __name__ == "__main__":
    try:
        run_all(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3])
    except BaseException:  # the test reads why, instead of waiting for results that never come
        write(Path(sys.argv[1]), {"error": traceback.format_exc()})
        raise
