"""The config folders a command reads, by its command line: the built-in configs,
``--config-dir DIR``, ``./conf`` and installed plugins' (config.py says where each comes from
and in which order Hydra searches them), and the warning for a file of the user's that a
built-in one of the same name hides.

``tuneup --help`` lists the groups of these folders (tuneup/usage.py); the command warns
about hidden files before it composes (tuneup/cli.py).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

from tuneup.trainer.config import builtin_dir, plugin_dirs, user_dir


def config_dir_option(argv: list[str]) -> Path | None:
    """The folder given with ``--config-dir``/``-cd`` in ``argv``, if any."""
    for i, arg in enumerate(argv):
        if arg in ("--config-dir", "-cd") and i + 1 < len(argv):
            return Path(argv[i + 1])
        for flag in ("--config-dir=", "-cd="):
            if arg.startswith(flag):
                return Path(arg[len(flag) :])
    return None


def config_dirs(argv: list[str]) -> Iterator[tuple[str, Path]]:
    """(label, folder) for every config folder a command with ``argv`` reads, search order."""
    yield "built-in", builtin_dir()
    given = config_dir_option(argv)
    if given is not None and given.is_dir():
        yield f"--config-dir {given}", given.resolve()
    if (own := user_dir()) is not None:
        yield "your configs", own
    for name, folder in plugin_dirs().items():
        yield f"plugin {name}", folder


def warn_shadowed(argv: list[str]) -> None:
    """Say which of the user's files are hidden by built-in ones of the same name."""
    for label, folder in list(config_dirs(argv))[1:]:
        if label.startswith("plugin"):
            continue
        for name in shadowed(folder):
            print(
                f"warning: {folder / name} is not used: tuneup's built-in {name} has the same "
                "name and is found first; rename yours",
                file=sys.stderr,
            )


def shadowed(user: Path) -> list[str]:
    """Files in the user's config folder that a built-in file of the same name hides."""
    base, found = builtin_dir(), []
    for path in sorted(user.rglob("*.yaml")):
        twin = base / path.relative_to(user)
        if twin.is_file() and twin.read_bytes() != path.read_bytes():
            found.append(str(path.relative_to(user)))
    return found
