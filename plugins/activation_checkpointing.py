"""Activation checkpointing, chosen by ``activation_checkpointing=off|blocks``: trade compute for memory.

``blocks`` runs each of the model's repeated blocks (chosen by class name,
``block_types``) under non-reentrant ``torch.utils.checkpoint``: autograd keeps
only the block's inputs, and the block's forward runs a second time during
backward to rebuild what its backward needs. Saved activation bytes drop (the
summary's ``saved_activation_bytes``, measured by plugins/measure.py, shows by how
much); a step costs about one extra forward of the checkpointed blocks.
``every_n=2`` checkpoints the 1st, 3rd, 5th... block only, for a middle ground.

Exactly what ``off`` computes: the recomputation repeats the forward's kernels
(RNG state included), so gradients are bit-identical wherever those kernels are
deterministic, and BatchNorm's running statistics are frozen during it so a
batch is not counted twice (torch's checkpoint alone would apply the momentum
update twice). Under torch.compile the compiler recomputes inside its backward
graph, which replays no buffer update, and the block traces without a graph break.

The wrapping is in place: each selected block gets an instance-level ``forward``
that calls its own forward under checkpoint. No module is added, so parameter
names and ``state_dict`` keys are those of ``off`` (checkpoints load either way),
``type(block)`` is unchanged, and ``Module.to`` (channels_last, half precision)
reaches the same parameters whichever runs first. That is why this plugin's
``configure_model`` is unflagged, like memory_format's: it runs after kernel
swaps (``tryfirst``) and before compile (``trylast``), and commutes with
memory_format, so the order between those two (pluggy: registration order) does
not matter. torch's own ``checkpoint_wrapper`` (torch.distributed) adds a
``_checkpoint_wrapped_module`` level to every parameter name, which is why it is
not used here.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import nn
from torch.nn.modules.batchnorm import _NormBase
from torch.utils.checkpoint import checkpoint

from tuneup import TuneupError, hookimpl
from tuneup.trainer.validation import Integer, OneOf, problem, problems


class CheckpointedForward:
    """A block's forward run under non-reentrant checkpoint; stored as ``block.forward``.

    It calls the class's forward, looked up at each call: a bound method stored
    here would pickle as ``getattr(block, "forward")``, i.e. as this object.
    """

    def __init__(self, block: nn.Module) -> None:
        self.block = block

    def inner(self, *args, **kwargs):
        return type(self.block).forward(self.block, *args, **kwargs)

    def __call__(self, *args, **kwargs):
        if not torch.is_grad_enabled():  # validation, no_grad: nothing is saved anyway
            return self.inner(*args, **kwargs)
        if torch.compiler.is_compiling():
            # torch.compile recomputes inside its own backward graph, which does not replay
            # buffer updates; the flag below would be a side effect that breaks the graph.
            return checkpoint(self.inner, *args, use_reentrant=False, **kwargs)
        recomputing = False

        def run(*inputs, **options):
            nonlocal recomputing
            if not recomputing:  # the first call is the forward; a second one is the recompute
                recomputing = True
                return self.inner(*inputs, **options)
            with running_stats_frozen(self.block):
                return self.inner(*inputs, **options)

        return checkpoint(run, *args, use_reentrant=False, **kwargs)


@contextmanager
def running_stats_frozen(block: nn.Module):
    """Normalisation layers in ``block`` leave their running statistics unchanged.

    Momentum 0 makes the update ``running = running`` (exactly), and the batch
    counter is put back; the recomputed outputs use batch statistics, which do
    not depend on the running ones.
    """
    norms = [m for m in block.modules() if isinstance(m, _NormBase) and m.training]
    norms = [m for m in norms if m.track_running_stats and m.num_batches_tracked is not None]
    saved = [(m, m.momentum, m.num_batches_tracked.clone()) for m in norms]
    for m in norms:
        m.momentum = 0.0
    try:
        yield
    finally:
        for m, momentum, count in saved:
            m.momentum = momentum
            m.num_batches_tracked.copy_(count)


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


def checkpoint_blocks(model: nn.Module, block_types, every_n: int = 1) -> list[str]:
    """Run the selected blocks of ``model`` under checkpoint, in place; returns their names.

    Idempotent: a block already checkpointed is not wrapped again.
    """
    names = select_blocks(model, block_types, every_n)
    for name in names:
        block = model.get_submodule(name)
        if not is_checkpointed(block):
            block.forward = CheckpointedForward(block)
    return names


def no_blocks_reason(model: nn.Module, block_types, model_name: str) -> str | None:
    """Why nothing would be checkpointed in ``model``, or None when some block matches."""
    if select_blocks(model, block_types):
        return None
    classes = sorted({type(m).__name__ for m in model.modules()})
    return problem(
        "activation_checkpointing.block_types",
        list(block_types),
        f"class names of the repeated blocks of model={model_name}, which has no module of "
        f"these classes (its classes: {', '.join(classes)}); name its block class, or use "
        "activation_checkpointing=off",
    )


def _is_names(value) -> bool:
    return len(value or ()) > 0 and all(isinstance(v, str) and v for v in value)


class Plugin:
    def __init__(self, cfg) -> None:
        settings = cfg.activation_checkpointing
        self.block_types = list(settings.get("block_types") or [])
        self.every_n = settings.get("every_n", 1)
        self.checkpointed: list[str] | None = None
        self.model_name = "the model"

    @hookimpl
    def check(self, cfg, plan):
        found = problems(
            cfg,
            {
                "activation_checkpointing.name": OneOf(("blocks",)),
                "activation_checkpointing.every_n": Integer(low=1),
            },
        )
        if not _is_names(self.block_types):
            found.append(
                problem(
                    "activation_checkpointing.block_types",
                    self.block_types,
                    "a non-empty list of module class names, e.g. [BasicBlock, Bottleneck]",
                )
            )
        elif (model := plan.meta_model()) is not None:
            reason = no_blocks_reason(model, self.block_types, plan.model_name)
            found += [reason] if reason else []
        self.model_name = plan.model_name
        return found

    @hookimpl
    def configure_model(self, cfg, model):
        reason = no_blocks_reason(model, self.block_types, self.model_name)
        if reason:
            raise TuneupError(reason)
        self.checkpointed = checkpoint_blocks(model, self.block_types, self.every_n)
        return model

    def describe(self):
        settings = {"name": "blocks", "block_types": self.block_types, "every_n": self.every_n}
        if self.checkpointed is not None:
            settings["checkpointed_blocks"] = len(self.checkpointed)
        return settings
