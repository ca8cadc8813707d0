"""Check the package's import map: `lint-imports` with the contracts in pyproject.toml.

Usage: .venv/bin/python .ci/lint_imports.py [lint-imports options, e.g. --verbose]

import-linter reads a package from its folder, and tuneup's parts live in folders of their
own (trainer/ is tuneup.trainer: package-dir in pyproject.toml). This lays the package out as
it is installed, as links in a temporary folder, and runs lint-imports on that.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def lay_out(package_dir: dict[str, str], into: Path) -> None:
    """Link each mapped folder where the installed package has it (shortest names first, so a
    package's own folder holds its files before its mapped subpackages are linked in)."""
    for name, folder in sorted(package_dir.items(), key=lambda item: item[0].count(".")):
        place = into.joinpath(*name.split("."))
        if name.count(".") == 0:
            place.mkdir(parents=True)
            for child in (ROOT / folder).iterdir():
                if child.name != "__pycache__":
                    (place / child.name).symlink_to(child)
        else:
            place.parent.mkdir(parents=True, exist_ok=True)
            place.symlink_to(ROOT / folder)


def main(arguments: list[str]) -> int:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    package_dir = pyproject["tool"]["setuptools"]["package-dir"]
    lint_imports = Path(sys.executable).parent / "lint-imports"
    if not lint_imports.exists():
        print(f"error: no {lint_imports}: install the test extra (pip install -e '.[test]')")
        return 1
    with tempfile.TemporaryDirectory() as tree:
        lay_out(package_dir, Path(tree))
        env = {**os.environ, "PYTHONPATH": tree}
        command = [str(lint_imports), str(ROOT / "pyproject.toml"), "--no-cache"]
        return subprocess.run([*command, *arguments], cwd=tree, env=env).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
