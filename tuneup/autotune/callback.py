"""A Hydra callback that makes ``hydra/sweeper=autotune`` known to Hydra in any install.

Hydra finds sweepers by walking the ``hydra_plugins`` folders on ``sys.path`` when it
starts. A regular install puts ``hydra_plugins/tuneup_autotune`` into site-packages, and a
checkout's ``python run.py`` has it beside run.py; an editable install (``pip install -e``)
maps the package through an import hook instead, which that walk cannot see. Callbacks are
made before the sweeper (hydra/_internal/hydra.py: ``multirun``), so registering the class
here, by hand, works everywhere; conf/experiment/autotune.yaml names this callback.
"""

from __future__ import annotations

from hydra.experimental.callback import Callback


class RegisterSweeper(Callback):
    def __init__(self) -> None:
        from hydra.core.plugins import Plugins

        from hydra_plugins.tuneup_autotune.autotune_sweeper import AutotuneSweeper

        Plugins.instance().register(AutotuneSweeper)
