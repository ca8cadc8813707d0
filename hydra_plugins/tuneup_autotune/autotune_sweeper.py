"""The sweeper class Hydra sees for ``hydra/sweeper=autotune`` (conf/hydra/sweeper/autotune.yaml).

It hands over to :class:`tuneup.autotune.sweeper.Autotune`, as hydra-optuna-sweeper's
``OptunaSweeper`` hands over to its implementation, so importing this module (Hydra
imports every module of ``hydra_plugins`` when it starts) costs nothing.
"""

from __future__ import annotations

from hydra.plugins.sweeper import Sweeper


class AutotuneSweeper(Sweeper):
    def __init__(self) -> None:
        from tuneup.autotune.sweeper import Autotune

        self.autotune = Autotune()

    def setup(self, *, hydra_context, task_function, config) -> None:
        self.autotune.setup(hydra_context=hydra_context, task_function=task_function, config=config)

    def sweep(self, arguments):
        return self.autotune.sweep(arguments)
