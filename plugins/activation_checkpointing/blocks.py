"""The blocks run under checkpoint: which blocks (:func:`select_blocks`), and the wrapping
that runs each one's forward under non-reentrant ``torch.utils.checkpoint``, in place
(:func:`checkpoint_blocks`).

The wrapping is an instance-level ``forward`` (:class:`CheckpointedForward`), not a wrapper
module, so parameter names and ``state_dict`` keys stay those of the plain model, and
``strategy=fsdp`` (plugins/strategy/parallelize.py) finds the same blocks by the same names.
The recompute repeats the forward's kernels with BatchNorm's running statistics frozen
(:func:`running_stats_frozen`), so a batch is counted once; with a policy (selective.py) the
outputs it names are kept. The plugin and its checks are in this package's ``__init__``.
"""

from __future__ import annotations

import functools
from contextlib import contextmanager

import torch
from torch import nn
from torch.nn.modules.batchnorm import _NormBase
from torch.utils.checkpoint import checkpoint

from tuneup.plugins.activation_checkpointing.selective import (
    SavePolicy,
    selective_contexts,
    show_kept,
)


class CheckpointedForward:
    """A block's forward run under non-reentrant checkpoint; stored as ``block.forward``.

    It calls the class's forward, looked up at each call: a bound method stored
    here would pickle as ``getattr(block, "forward")``, i.e. as this object.
    With a ``policy`` (selective) the outputs it names are kept and the rest recomputed.
    """

    def __init__(self, block: nn.Module, policy: SavePolicy | None = None) -> None:
        self.block = block
        self.policy = policy

    def inner(self, *args, **kwargs):
        return type(self.block).forward(self.block, *args, **kwargs)

    def __call__(self, *args, **kwargs):
        if not torch.is_grad_enabled():  # validation, no_grad: nothing is saved anyway
            return self.inner(*args, **kwargs)
        caches: list = []
        options = {"use_reentrant": False}
        if self.policy is not None:
            options["context_fn"] = functools.partial(selective_contexts, self.policy, caches)
        if torch.compiler.is_compiling():
            # torch.compile recomputes inside its own backward graph, which does not replay
            # buffer updates; the flag below would be a side effect that breaks the graph.
            return checkpoint(self.inner, *args, **options, **kwargs)
        recomputing = False
        norms = tracked_norms(self.block)
        counters = [torch.zeros_like(m.num_batches_tracked) for m in norms]

        def run(*inputs, **options):
            nonlocal recomputing
            if not recomputing:  # the first call is the forward; a second one is the recompute
                recomputing = True
                return self.inner(*inputs, **options)
            with running_stats_frozen(norms, counters):
                return self.inner(*inputs, **options)

        output = checkpoint(run, *args, **options, **kwargs)
        show_kept(caches)
        return output


def tracked_norms(block: nn.Module) -> list[_NormBase]:
    """Normalisation layers of ``block`` that update running statistics in this forward."""
    norms = [m for m in block.modules() if isinstance(m, _NormBase) and m.training]
    return [m for m in norms if m.track_running_stats and m.num_batches_tracked is not None]


@contextmanager
def running_stats_frozen(norms: list[_NormBase], counters: list[torch.Tensor]):
    """``norms`` leave their running statistics and batch counts unchanged.

    Momentum 0 makes the update ``running = running`` (exactly), and each layer counts
    into a stand-in counter (``counters``, made before the checkpoint) instead of its own;
    the recomputed outputs use batch statistics, which do not depend on the running ones.
    Only attributes change here, no tensor op runs: under selective checkpointing the
    recompute must repeat the forward's ops and no others.
    """
    saved = [(m, m.momentum, m.num_batches_tracked) for m in norms]
    for m, counter in zip(norms, counters, strict=True):
        m.momentum = 0.0
        m.num_batches_tracked = counter
    try:
        yield
    finally:
        for m, momentum, count in saved:
            m.momentum = momentum
            m.num_batches_tracked = count


def select_blocks(model: nn.Module, block_types, every_n: int = 1) -> list[str]:
    """Names of the outermost modules whose class name is in ``block_types``; every n-th of them.

    Blocks nested in a selected block are left out (checkpointing both would
    recompute the inner one twice). Order is the modules' registration order.
    """
    wanted, found = set(block_types), []
    for name, module in model.named_modules():
        if type(module).__name__ in wanted and not any(name.startswith(f"{f}.") for f in found):
            found.append(name)
    return found[::every_n]


def is_checkpointed(block: nn.Module) -> bool:
    return isinstance(block.__dict__.get("forward"), CheckpointedForward)


def checkpoint_blocks(
    model: nn.Module, block_types, every_n: int = 1, policy: SavePolicy | None = None
) -> list[str]:
    """Run the selected blocks of ``model`` under checkpoint, in place; returns their names.

    ``policy``: selective checkpointing (keep what it names), else the whole block.
    Idempotent: a block already checkpointed is not wrapped again.
    """
    names = select_blocks(model, block_types, every_n)
    for name in names:
        block = model.get_submodule(name)
        if not is_checkpointed(block):
            block.forward = CheckpointedForward(block, policy)
    return names
