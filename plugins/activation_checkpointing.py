"""Activation checkpointing, ``activation_checkpointing=off|blocks|selective``: compute for memory.

``blocks`` runs each of the model's repeated blocks (chosen by class name,
``block_types``) under non-reentrant ``torch.utils.checkpoint``: autograd keeps
only the block's inputs, and the block's forward runs a second time during
backward to rebuild what its backward needs. Saved activation bytes drop (the
summary's ``saved_activation_bytes``, measured by plugins/measure/saved_bytes.py, shows by how
much); a step costs about one extra forward of the checkpointed blocks.
``every_n=2`` checkpoints the 1st, 3rd, 5th... block only, for a middle ground.

``selective`` checkpoints the same blocks with a policy by op (torch's selective
checkpoint contexts, ``create_selective_checkpoint_contexts``): the outputs of the ops
that are expensive to recompute (``save``: matmuls, attention, convolutions) are kept,
the cheap rest (norms, activations, casts, copies) is recomputed in backward, and so
are matmuls that widen their input more than ``recompute_wider_than`` times (a
transformer MLP's 4x up-projection: its output is the largest activation of a block).
Those kept outputs live in the checkpoint's own cache, where saved-tensor hooks do not
see them; each block passes them to the hook that is active outside it, so
``saved_activation_bytes`` counts them (:func:`show_kept`).

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

A model that keeps a key/value cache while training (a Hugging Face model whose
``config.use_cache`` is true, GPT-2's default) appends to it in each block's forward, so
the recompute sees a longer cache and runs other ops than the forward did: selective
checkpointing fails mid-training (``aten.slice.Tensor encountered during backward but
not found in storage``) and ``blocks`` only works because the cache is sliced. Training
needs no cache, so it is switched off on the model (``config.use_cache = False``), with a
line in the log and ``use_cache`` in this plugin's summary settings.
"""

from __future__ import annotations

import functools
import logging
from contextlib import contextmanager

import torch
from torch import nn
from torch.nn.modules.batchnorm import _NormBase
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

from tuneup import TuneupError, hookimpl
from tuneup.trainer.validation import Integer, Number, OneOf, problem, problems

log = logging.getLogger(__name__)

CHOICES = ("blocks", "selective")
#: What ``save`` may name: kinds of ops whose outputs selective checkpointing keeps.
SAVE_KINDS = {
    "matmul": ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_scaled_mm"),
    "attention": (
        "aten::_scaled_dot_product_flash_attention",
        "aten::_scaled_dot_product_flash_attention_for_cpu",
        "aten::_scaled_dot_product_efficient_attention",
        "aten::_scaled_dot_product_cudnn_attention",
        "aten::_flash_attention_forward",
        "aten::_efficient_attention_forward",
    ),
    "convolution": ("aten::convolution",),
}


class SavePolicy:
    """Selective checkpointing's policy by op: keep the outputs of the ``save`` kinds, recompute
    the rest, and matmuls or convolutions whose output is more than ``recompute_wider_than``
    times as wide as their input (None: keep them all).

    Why widening ones: a matmul's output costs 1/k bytes per FLOP to keep (k: its input
    width) whatever its own width, so among matmuls with the same input the widest output
    frees the most memory per recompute; in a transformer block that is the MLP's 4x
    up-projection, a third of the block's matmul FLOPs. Picklable (op names, not op objects).
    """

    def __init__(self, save=("matmul", "attention", "convolution"), recompute_wider_than=3.0):
        self.names = frozenset(name for kind in save for name in SAVE_KINDS[kind])
        self.recompute_wider_than = recompute_wider_than

    def __call__(self, ctx, func, *args, **kwargs) -> CheckpointPolicy:
        if self.keeps(func, args):
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    def keeps(self, func, args) -> bool:
        name = func.name() if hasattr(func, "name") else None
        if name not in self.names:
            return False
        limit = self.recompute_wider_than
        return limit is None or widening(name, args) <= limit


def widening(name: str, args) -> float:
    """How many times wider an op's output is than its input (1 where that means nothing)."""
    if name in ("aten::addmm", "aten::baddbmm"):
        args = args[1:]  # (bias, mat1, mat2)
    if name in SAVE_KINDS["matmul"]:
        return args[1].shape[-1] / args[0].shape[-1]
    if name == "aten::convolution":
        x, weight, transposed, groups = args[0], args[1], args[6], args[8]
        out_channels = weight.shape[1] * groups if transposed else weight.shape[0]
        return out_channels / x.shape[1]
    return 1.0


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


def selective_contexts(policy: SavePolicy, caches: list):
    """torch's selective checkpoint contexts for ``policy``; notes the forward's cache."""
    forward, recompute = create_selective_checkpoint_contexts(policy)
    caches.append(forward.storage)
    return forward, recompute


def show_kept(caches: list) -> None:
    """Hand the tensors a selective checkpoint keeps to the saved-tensor hook active around it.

    They are held in the checkpoint's cache until its backward, not in autograd's saved
    tensors, so a pack hook (plugins/measure/saved_bytes.py) never sees them.
    Calling that hook's pack once per tensor shows them without keeping anything more.
    torch has no public getter for the active hook; this private one exists since 2.0.
    """
    hooks = torch._C._autograd._top_saved_tensors_default_hooks(False)
    if hooks is None:
        return
    pack, _ = hooks
    for cache in caches:
        for tensor in _tensors_in(cache):
            pack(tensor)


def _tensors_in(value):
    """Every tensor in a selective checkpoint's cache (nested containers of version wrappers)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif hasattr(value, "val"):  # torch.utils.checkpoint._VersionWrapper
        yield from _tensors_in(value.val)
    elif isinstance(value, (dict, list, tuple)):
        for item in value.values() if isinstance(value, dict) else value:
            yield from _tensors_in(item)


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


def switch_cache_off(model: nn.Module) -> bool:
    """Set ``config.use_cache = False`` on every module of ``model`` whose config has it true
    (a transformers model: its key/value cache changes what a recompute runs, see the module
    docstring). Returns whether any was on."""
    configs = {id(c): c for m in model.modules() if (c := getattr(m, "config", None)) is not None}
    switched = [c for c in configs.values() if getattr(c, "use_cache", None) is True]
    for config in switched:
        config.use_cache = False
    return bool(switched)


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


RULES = {
    "activation_checkpointing.name": OneOf(CHOICES),
    "activation_checkpointing.every_n": Integer(low=1),
    "activation_checkpointing.recompute_wider_than": Number(ge=1, also=(None,)),
}


def save_problems(save) -> list[str]:
    if _is_names(save) and set(save) <= set(SAVE_KINDS):
        return []
    allowed = f"a non-empty list of {', '.join(SAVE_KINDS)}"
    return [problem("activation_checkpointing.save", save, allowed)]


class Plugin:
    def __init__(self, cfg) -> None:
        settings = cfg.activation_checkpointing
        self.name = settings.get("name", "blocks")
        self.block_types = list(settings.get("block_types") or [])
        self.every_n = settings.get("every_n", 1)
        self.save = list(settings.get("save") or [])
        self.recompute_wider_than = settings.get("recompute_wider_than")
        self.checkpointed: list[str] | None = None
        self.cache_switched_off = False
        self.model_name = "the model"

    @property
    def policy(self) -> SavePolicy | None:
        if self.name != "selective":
            return None
        return SavePolicy(self.save, self.recompute_wider_than)

    @hookimpl
    def check(self, cfg, plan):
        found = problems(cfg, RULES)
        if self.name == "selective":
            found += save_problems(self.save)
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
        self.checkpointed = checkpoint_blocks(model, self.block_types, self.every_n, self.policy)
        self.cache_switched_off = switch_cache_off(model)
        if self.cache_switched_off:
            log.info(
                "activation_checkpointing: the model's key/value cache is switched off for "
                "training (config.use_cache=False): recomputed blocks must run the ops of "
                "their forward, which a growing cache changes"
            )
        return model

    def describe(self):
        settings = {"name": self.name, "block_types": self.block_types, "every_n": self.every_n}
        if self.name == "selective":
            settings |= {"save": self.save, "recompute_wider_than": self.recompute_wider_than}
        if self.checkpointed is not None:
            settings["checkpointed_blocks"] = len(self.checkpointed)
        if self.cache_switched_off:
            settings["use_cache"] = "switched off for training (config.use_cache=False)"
        return settings
