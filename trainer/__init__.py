"""tuneup's core: hook specs, plugin manager, Lightning bridge, build + run, summary.

Plugins mark their hook implementations with ``@hookimpl``::

    from trainer import hookimpl

    class Plugin:
        @hookimpl
        def report(self, summary):
            summary["hello"] = "world"
"""

import pluggy

PROJECT = "tuneup"
hookimpl = pluggy.HookimplMarker(PROJECT)


class TuneupError(Exception):
    """An error the user can fix; shown without a traceback and the run exits with code 1."""


def run(cfg, run_dir=None):
    """Train as ``cfg`` says; see :func:`trainer.runner.run`."""
    from trainer.runner import run as _run

    return _run(cfg, run_dir)


__all__ = ["PROJECT", "TuneupError", "hookimpl", "run"]
