"""The sweeper class Hydra sees for ``hydra/sweeper=optuna`` (conf/hydra/sweeper/optuna.yaml).

It hands over to :class:`tuneup.optuna.sweeper.OptunaSearch`, as the autotune's sweeper does,
so importing this module (Hydra imports every module of ``hydra_plugins`` when it starts)
imports neither optuna nor torch.
"""

from __future__ import annotations

from hydra.plugins.sweeper import Sweeper
from omegaconf import OmegaConf


class OptunaSweeper(Sweeper):
    def __init__(self, sampler, pruner, **settings) -> None:
        """The keys of conf/hydra/sweeper/optuna.yaml; Hydra has made the sampler and the pruner
        from their nodes (the grid sampler half: it needs the grid). tuneup.optuna checks the
        rest."""
        from tuneup.optuna.sweeper import OptunaSearch

        self.search = OptunaSearch(sampler, pruner, OmegaConf.create(settings))

    def setup(self, *, hydra_context, task_function, config) -> None:
        self.search.setup(hydra_context=hydra_context, task_function=task_function, config=config)

    def sweep(self, arguments):
        return self.search.sweep(arguments)
