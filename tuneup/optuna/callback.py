"""A Hydra callback that makes ``hydra/sweeper=optuna`` known to Hydra in any install.

Hydra finds sweepers by walking the ``hydra_plugins`` folders on ``sys.path`` when it
starts; an editable install (``pip install -e``) maps ``hydra_plugins/tuneup_optuna``
through an import hook, which that walk cannot see, so ``tuneup -m hparams_search=optuna``
outside the checkout failed with "Unknown plugin class". Callbacks are made before the
sweeper, so registering the class here works everywhere (as tuneup/autotune/callback.py
does for the autotune); conf/hparams_search/optuna.yaml names this callback.
"""

from __future__ import annotations

from hydra.experimental.callback import Callback


class RegisterSweeper(Callback):
    def __init__(self) -> None:
        from hydra.core.plugins import Plugins

        from hydra_plugins.tuneup_optuna.optuna_sweeper import OptunaSweeper

        Plugins.instance().register(OptunaSweeper)
