"""The oldest Triton the ``kernels`` extra allows, pip-installed once into pytest's cache.

test_triton_kernels.py runs the kernels under its interpreter too. Installing it is a download
of some 700 MB (17 s here) that needs little CPU: tests/kernels/interpreted_runs.py installs it
in the background from the session's start, while the installed Triton's interpreted tests
run. Standard library only: it must start in milliseconds.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def oldest_supported_triton() -> str:
    """X of ``triton>=X`` in the ``kernels`` extra of pyproject.toml."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (requirement,) = extras["optional-dependencies"]["kernels"]
    return re.fullmatch(r"triton>=([\d.]+)", requirement).group(1)


def folder_name(version: str) -> str:
    """The cache folder (``config.cache.mkdir(name)``) that holds triton==version."""
    return f"triton-{version}"


def cache_dir(cache) -> Path:
    """The folder of pytest's ``cache`` (``config.cache``) that :func:`install` installs into."""
    return cache.mkdir(folder_name(oldest_supported_triton())).parent


def install(version: str, cache_dir: Path) -> tuple[Path | None, str]:
    """``cache_dir/triton-VERSION`` holding triton==version, or None and pip's error. Installed
    under an exclusive lock, into a scratch folder renamed into place when pip is done: a
    second caller (the test, while the background install runs) waits for the first and finds
    it there."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    target = cache_dir / folder_name(version)
    with open(cache_dir / f"{folder_name(version)}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / "triton" / "__init__.py").is_file():
            return target, ""
        scratch = cache_dir / f"{folder_name(version)}.partial"
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(target, ignore_errors=True)
        command = [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--retries",
            "1",
            "--upgrade",
            "--target",
            str(scratch),
            f"triton=={version}",
        ]
        done = subprocess.run(command, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            shutil.rmtree(scratch, ignore_errors=True)
            return None, done.stderr[-2000:]
        os.rename(scratch, target)
        return target, ""
