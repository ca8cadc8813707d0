"""A test plugin that makes the model run out of memory on batches above a size, on CPU.

In process: ``add_plugin(OutOfMemoryAbove(4))``. In the processes of a multi-process run: an
installed distribution (tests/plugin_dists.py) whose module is :data:`ENTRY_POINT_MODULE`,
set by the environment (``OOM_ABOVE``, ``OOM_RANK``).
"""

from __future__ import annotations

import torch

from tuneup import hookimpl


class OutOfMemoryAbove:
    """Raises ``torch.OutOfMemoryError`` when a training forward of the model sees more than
    ``limit`` samples (on the process of global rank ``rank`` only, when given); counts them."""

    def __init__(self, limit: int, rank: int | None = None) -> None:
        self.limit, self.rank = limit, rank
        self.raised = 0
        self.global_rank = 0

    @hookimpl(tryfirst=True)  # on the model as built: a hook that runs before any wrapper's
    def configure_model(self, model):
        model.register_forward_pre_hook(self._check)

    @hookimpl
    def on_fit_start(self, trainer):
        self.global_rank = trainer.global_rank

    def _check(self, module, args) -> None:
        samples = args[0].shape[0]
        if module.training and samples > self.limit and self.rank in (None, self.global_rank):
            self.raised += 1
            raise torch.OutOfMemoryError(f"test: {samples} samples > {self.limit}")


ENTRY_POINT_MODULE = """
import os
from tests.oom_plugin import OutOfMemoryAbove

class Plugin(OutOfMemoryAbove):
    def __init__(self):
        rank = os.environ.get("OOM_RANK")
        super().__init__(int(os.environ["OOM_ABOVE"]), None if rank is None else int(rank))
"""
