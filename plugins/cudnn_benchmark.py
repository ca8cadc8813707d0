"""cuDNN autotuning, chosen by ``cudnn_benchmark=off|on``: the fastest convolution algorithm per shape.

``torch.backends.cudnn.benchmark=True`` makes cuDNN time its candidate
algorithms the first time it meets a convolution shape and keep the fastest.
It pays off when shapes repeat (fixed image size, ``drop_last`` training
batches); every new shape costs one benchmark, and the chosen algorithms may
differ from run to run (not bit-reproducible).

The flag is set through Lightning's own ``Trainer(benchmark=True)``, which sets
it when the Trainer is made but never puts it back; this plugin restores the
previous value when fit ends or fails, so later work in the same process (a
test, a sweep of in-process runs) is not changed by this run.

It affects cuDNN only: on CPU the flag is set and restored but changes nothing,
which ``describe()`` says.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from tuneup import hookimpl


@contextmanager
def cudnn_benchmark(enabled: bool = True):
    """``torch.backends.cudnn.benchmark = enabled`` inside the block, the previous value after."""
    previous = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = enabled
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = previous


class Plugin:
    def __init__(self) -> None:
        self.previous: bool | None = None  # the flag before this run set it
        self.accelerator: str | None = None

    @hookimpl
    def check(self, cfg, env):
        self.accelerator = env.accelerator
        trainer = cfg.trainer
        if deterministic := trainer.get("deterministic"):  # True or Lightning's "warn"
            return [
                f"cudnn_benchmark=on conflicts with trainer.deterministic={deterministic}: "
                "autotuning picks algorithms by timing, so results are not reproducible; choose "
                "one of the two"
            ]
        if trainer.get("benchmark") is False:
            return [
                "cudnn_benchmark=on conflicts with trainer.benchmark=False (the same switch, "
                "Lightning's); remove trainer.benchmark or use cudnn_benchmark=off"
            ]
        return []

    @hookimpl
    def configure_trainer(self, kwargs):
        self.previous = torch.backends.cudnn.benchmark
        kwargs["benchmark"] = True  # Lightning sets torch.backends.cudnn.benchmark from it

    def _restore(self) -> None:
        if self.previous is not None:
            torch.backends.cudnn.benchmark, self.previous = self.previous, None

    @hookimpl
    def on_fit_end(self):
        self._restore()

    @hookimpl
    def on_exception(self):
        self._restore()

    def describe(self):
        settings = {"name": "on"}
        if self.accelerator is not None and self.accelerator != "cuda":
            settings["effect"] = f"none on {self.accelerator}: cuDNN runs on CUDA only"
        return settings
