"""Model parallelism for any ``nn.Module``: tensor parallelism, then FSDP2, torchtitan's order.

:func:`parallelize` is what ``strategy=fsdp`` does to the model once the processes and
their device mesh exist (Lightning's ``ModelParallelStrategy`` makes the mesh,
``("data_parallel", "tensor_parallel")``):

1. **Tensor parallelism** (``strategy.tensor_parallel_size`` > 1): the plan applied over the
   tensor-parallel group (:mod:`plugins.strategy.tensor_parallel`: the plan, its checks, the
   styles).
2. Activation checkpointing was applied before (plugins/activation_checkpointing/blocks.py wraps
   the blocks' ``forward`` in place, adding no module, so names stay what the plan says).
3. ``compile=on``: each block is compiled on its own (``Module.compile``), not the whole
   model, so FSDP's hooks stay outside the compiled regions.
4. **FSDP2** (``fully_shard``) on each block (``strategy.shard_blocks``; by default found as
   ``activation_checkpointing=blocks`` finds them), then on the root, over the mesh's
   data-parallel dimension, with ``reshard_after_forward``, CPU offload and the mixed
   precision policy of ``precision=`` (:func:`mixed_precision`).

Here: the order, which blocks are sharded and compiled, and FSDP2. Every function takes the
plain model and returns it changed in place; they are used and tested directly.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from tuneup.plugins.strategy.tensor_parallel import apply_tensor_parallel

#: Block class names looked for when ``strategy.shard_blocks`` is null (those of
#: ``activation_checkpointing=blocks``): ResNets' and model=gpt's.
DEFAULT_BLOCKS = ("BasicBlock", "Bottleneck", "Block")


@dataclass
class Layout:
    """What :func:`parallelize` did: for the summary and ``plugins.list``."""

    tensor_parallel: dict[str, str] = field(default_factory=dict)  # module name -> style
    sharded_blocks: list[str] = field(default_factory=list)
    compiled_blocks: list[str] = field(default_factory=list)
    #: How the empty parameters got their values (plugins/strategy/materialize.py); None: the
    #: model was built whole (strategy.init=full, or weights loaded before training).
    init: str | None = None


def shard_block_names(model: nn.Module, block_types=None) -> list[str]:
    """The modules FSDP shards one by one (each its own all-gather), before the root.

    ``block_types`` names classes (outermost modules of those classes); None: the
    classes of :data:`DEFAULT_BLOCKS`, else the members of the model's outermost
    ``nn.ModuleList``s (torchtitan's ``model.layers``), else none (the root alone).
    """
    from tuneup.plugins.activation_checkpointing.blocks import select_blocks

    if block_types:
        return select_blocks(model, block_types)
    found = select_blocks(model, DEFAULT_BLOCKS)
    if found:
        return found
    lists = select_blocks(model, ["ModuleList"])
    return [
        f"{name}.{child}"
        for name in lists
        for child, _ in model.get_submodule(name).named_children()
    ]


def mixed_precision(param_dtype: torch.dtype | None, reduce_dtype=torch.float32):
    """FSDP2's policy: parameters all-gathered (and computed) in ``param_dtype``, gradients
    reduced in ``reduce_dtype`` (:func:`apply_fsdp` has the root's outputs cast back to fp32
    for the loss)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if param_dtype is None:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)


def apply_fsdp(
    model: nn.Module,
    mesh,
    blocks: list[str],
    reshard_after_forward: bool = True,
    cpu_offload: bool = False,
    policy=None,
) -> list[str]:
    """``fully_shard`` each of ``blocks``, then the root, over ``mesh`` (data-parallel)."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    options = {"mesh": mesh, "mp_policy": policy or MixedPrecisionPolicy()}
    if cpu_offload:
        options["offload_policy"] = CPUOffloadPolicy()
    for i, name in enumerate(blocks):
        # The last block's parameters are needed again first in backward: keep them.
        last = i == len(blocks) - 1
        fully_shard(
            model.get_submodule(name),
            **options,
            reshard_after_forward=reshard_after_forward and not last,
        )
    if options["mp_policy"].param_dtype is not None:  # the model's output in fp32, for the loss
        options["mp_policy"] = dataclasses.replace(options["mp_policy"], output_dtype=torch.float32)
    fully_shard(model, **options, reshard_after_forward=reshard_after_forward)
    return blocks


def compile_blocks(model: nn.Module, blocks: list[str], **options) -> list[str]:
    """``torch.compile`` each block in place (``Module.compile``), torchtitan's per-block compile."""
    for name in blocks:
        model.get_submodule(name).compile(**options)
    return blocks


@dataclass
class Settings:
    """What :func:`parallelize` needs, read from the config by the strategy plugin."""

    tp_plan: dict[str, str] = field(default_factory=dict)
    shard_blocks: list[str] | None = None
    reshard_after_forward: bool = True
    cpu_offload: bool = False
    param_dtype: torch.dtype | None = None
    compile_options: dict | None = None  # compile=on: torch.compile's options, per block
    #: How a model built empty (parameters on the meta device) is materialised and initialised
    #: once parallelised: ``strategy.init`` resolved (plugins/strategy/materialize.py).
    init: str = "broadcast"
    seed: int = 0  # the run's seed: init=reset_parameters|hf draw from it as one process does
    #: Fills the materialised, parallelised model's parameters in place, e.g. from a pretrained
    #: checkpoint; None: initialise them as ``init`` says.
    weights: Callable[[nn.Module], None] | None = None
    #: ``init=broadcast``: builds the whole model, initialised as one process builds it (rank 0
    #: calls it and broadcasts the weights; plugins/strategy/materialize.py).
    build: Callable[[], nn.Module] | None = None


def parallelize(model: nn.Module, mesh, settings: Settings) -> Layout:
    """Tensor parallelism, per-block compile, then FSDP2: the whole of ``strategy=fsdp``."""
    layout = Layout()
    tp, dp = mesh["tensor_parallel"], mesh["data_parallel"]
    if tp.size() > 1:
        layout.tensor_parallel = apply_tensor_parallel(model, tp, settings.tp_plan)
    blocks = shard_block_names(model, settings.shard_blocks)
    if settings.compile_options is not None:
        layout.compiled_blocks = compile_blocks(model, blocks, **settings.compile_options)
    policy = mixed_precision(settings.param_dtype)
    layout.sharded_blocks = apply_fsdp(
        model, dp, blocks, settings.reshard_after_forward, settings.cpu_offload, policy
    )
    return layout
