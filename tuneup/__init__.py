"""tuneup: Hydra configs switch training optimizations on; pluggy plugins hook them into Lightning.

What a user or a plugin author imports is here; everything else lives in the package's parts::

    tuneup              this API, the ``tuneup`` command (cli)
    tuneup.trainer      the core: hook specs, plugin manager, runner, Lightning bridge, training
                        module, where configs come from (config), config checks, the console;
                        tuneup.trainer.state: checkpoints, resume, data order, RNG, preemption,
                        divergence
    tuneup.plugins      the built-in plugins, one per feature (precision=fp16 -> plugins/precision/)
    tuneup.zoo          the built-in models and data sets (a model's or data's _target_ replaces them)
    tuneup.conf         the built-in Hydra configs
    tuneup.report       sweep reports; tuneup.autotune, tuneup.optuna: the sweepers
    tuneup.stats        the statistics they decide by; tuneup.errors: TuneupError

Plugins mark their hook implementations with ``@hookimpl``::

    from tuneup import hookimpl

    class Plugin:
        @hookimpl
        def report(self, summary):
            summary["hello"] = "world"

In Python, ``tuneup.run(tuneup.compose(["precision=bf16"]), run_dir="out")`` trains as
``tuneup precision=bf16`` would.

Importing this module is cheap (pluggy only): the command's ``--help`` and config errors
do not wait for torch or Lightning.
"""

import pluggy

from tuneup.errors import TuneupError
from tuneup.trainer.hookspecs import PROJECT

hookimpl = pluggy.HookimplMarker(PROJECT)


def run(cfg, run_dir=None):
    """Train as ``cfg`` says; see :func:`tuneup.trainer.runner.run`."""
    from tuneup.trainer.runner import run as _run

    return _run(cfg, run_dir)


def compose(overrides=(), config_dir=None):
    """The config ``tuneup OVERRIDES`` would train with; see :func:`tuneup.trainer.config.compose`."""
    from tuneup.trainer.config import compose as _compose

    return _compose(overrides, config_dir)


__all__ = ["PROJECT", "TuneupError", "compose", "hookimpl", "run"]
