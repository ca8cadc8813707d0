"""What gets installed: every package folder is in the distribution, every built-in plugin is an
entry point, and imports point one way (the core finds the plugins by entry point)."""

from __future__ import annotations

import ast
import importlib.metadata
import subprocess
import sys
import tomllib
from pathlib import Path

from tests.conftest import ROOT

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]


def package_folders() -> dict[str, str]:
    """Every folder holding an __init__.py under a mapped root, by its installed package name."""
    found = {}
    for package, folder in SETUPTOOLS["package-dir"].items():
        for init in (ROOT / folder).rglob("__init__.py"):
            relative = init.parent.relative_to(ROOT / folder).parts
            if "__pycache__" not in relative:
                found[".".join((package, *relative))] = str(init.parent)
    return found


def test_every_package_folder_is_listed_for_installation():
    assert sorted(SETUPTOOLS["packages"]) == sorted(package_folders())


def test_every_built_in_plugin_is_an_entry_point_and_the_install_is_current():
    declared = PYPROJECT["project"]["entry-points"]["tuneup"]
    modules = {p.stem for p in (ROOT / "plugins").glob("*.py") if not p.stem.startswith("_")}
    modules |= {p.parent.name for p in (ROOT / "plugins").glob("*/__init__.py")}
    assert sorted(declared) == sorted(modules)
    assert all(target == f"tuneup.plugins.{name}:Plugin" for name, target in declared.items())
    installed = {
        ep.name: ep.value
        for ep in importlib.metadata.entry_points(group="tuneup")
        if ep.dist and ep.dist.name == "tuneup"
    }
    assert installed == declared, "reinstall: pip install -e ."


def test_imports_point_one_way():
    """The import-linter contracts in pyproject.toml: the core imports neither the plugins, the
    zoo (but in trainer/components.py and component_checks.py) nor the commands and features; no cycles."""
    script = ROOT / ".ci" / "lint_imports.py"
    done = subprocess.run([sys.executable, script], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def own_imports(package: str, init: Path) -> set[str]:
    """The package's own modules its ``__init__.py`` imports, anywhere in it (in a function
    too: import-linter counts those)."""
    found = set()
    for node in ast.walk(ast.parse(init.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package if node.level else node.module or ""
            names = [f"{base}.{node.module}" if node.level and node.module else base]
            names += [f"{names[0]}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        found |= {name for name in names if name.startswith(f"{package}.")}
    return found


def test_every_package_whose_init_imports_its_modules_is_guarded_against_their_import_back():
    """acyclic_siblings does not see a circle through a package's own __init__: the forbidden
    contract must name every package whose __init__ imports its modules (tuneup itself has a
    contract of its own)."""
    importing = sorted(
        package
        for package, folder in package_folders().items()
        if package.startswith("tuneup.") and own_imports(package, Path(folder) / "__init__.py")
    )
    contract = next(
        c
        for c in PYPROJECT["tool"]["importlinter"]["contracts"]
        if c["name"] == "A package whose __init__ imports its modules is not imported by them"
    )
    assert sorted(contract["forbidden_modules"]) == importing
    assert sorted(contract["source_modules"]) == [f"{package}.**" for package in importing]
