"""Errors the user can fix, and how a sweeper shows them.

A leaf of the package: it imports nothing of tuneup, so the core, the sweepers and the
plugins share it without importing each other (``tuneup.TuneupError`` is this class).
"""

from __future__ import annotations

import sys
from contextlib import contextmanager


class TuneupError(Exception):
    """An error the user can fix; shown without a traceback and the run exits with code 1."""


@contextmanager
def user_errors():
    """A TuneupError becomes one line on stderr and exit code 1, as the command does for a
    run (raised through Hydra, it would print a traceback)."""
    try:
        yield
    except TuneupError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(1) from exc
