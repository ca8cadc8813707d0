"""pytest's rewritten test modules, written once by the controller before the workers collect.

pytest rewrites the asserts of each test module and conftest.py as it imports them (read,
parse, rewrite, compile: some 3 CPU-s for the suite's files) and keeps the result in
``__pycache__`` unless writing bytecode is off (``PYTHONDONTWRITEBYTECODE=1``, this project's
machines): there each xdist worker, which collects every file, rewrote every file again, and
a clean clone's two workers always did, both at once. :func:`write` writes pytest's own cache
files in the controller, before the workers start; a worker takes a file only where pytest's
own check passes (its version in the name, the source's hash inside) and rewrites the others
itself. pytest has no public interface for this: where its private one differs, nothing is
written and each worker rewrites, as without this module.
"""

from __future__ import annotations

import types
from pathlib import Path


def write(paths: list[Path], config) -> int:
    """The rewritten code of every test module and conftest.py among ``paths`` (files, and
    folders: the files under them) in pytest's cache where it is missing or stale; how many
    files were written."""
    try:
        from _pytest.assertion import rewrite
        from _pytest.pathlib import fnmatch_ex

        patterns = config.getini("python_files")
        cache_name, read, rewrite_test, write_pyc = (
            rewrite.PYC_TAIL,
            rewrite._read_pyc,
            rewrite._rewrite_test,
            rewrite._write_pyc,
        )
    except (ImportError, AttributeError, ValueError):
        return 0
    state = types.SimpleNamespace(trace=lambda message: None)  # all _write_pyc uses of it
    written = 0
    files = {f for p in paths for f in (p.rglob("*.py") if p.is_dir() else [p])}
    for source in sorted(f for f in files if f.suffix == ".py"):
        if source.name != "conftest.py" and not any(fnmatch_ex(p, source) for p in patterns):
            continue
        pyc = rewrite.get_cache_dir(source) / (source.name[:-3] + cache_name)
        try:
            if read(source, pyc) is not None:
                continue
            source_hash, code = rewrite_test(source, config)
            pyc.parent.mkdir(exist_ok=True)
            written += bool(write_pyc(state, code, source_hash, pyc))
        except (OSError, SyntaxError, TypeError, ValueError):
            continue  # the worker rewrites it, and reports what is wrong with it
    return written
