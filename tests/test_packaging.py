"""What gets installed: every package folder is in the distribution, every built-in plugin is an
entry point, and the core does not import the plugins (it finds them by entry point)."""

from __future__ import annotations

import ast
import importlib.metadata
import tomllib

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
    installed = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="tuneup")
                 if ep.dist and ep.dist.name == "tuneup"}  # fmt: skip
    assert installed == declared, "reinstall: pip install -e ."


def imported(path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
        elif isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
    return names


def test_the_core_never_imports_the_plugins_and_reaches_the_zoo_in_one_place():
    for path in (ROOT / "trainer").rglob("*.py"):
        assert not any(n.startswith("tuneup.plugins") for n in imported(path)), path
    for path in [*(ROOT / "trainer").rglob("*.py"), *(ROOT / "plugins").rglob("*.py")]:
        if path.name != "components.py":
            assert not any(n.startswith("tuneup.zoo") for n in imported(path)), path
