"""Activation checkpointing, ``activation_checkpointing=off|blocks|selective``: compute for memory.

``blocks`` runs each of the model's repeated blocks (chosen by class name,
``block_types``) under non-reentrant ``torch.utils.checkpoint``: autograd keeps
only the block's inputs, and the block's forward runs a second time during
backward to rebuild what its backward needs. Saved activation bytes drop (the
summary's ``saved_activation_bytes``, measured by plugins/measure/saved_bytes.py, shows by how
much); a step costs about one extra forward of the checkpointed blocks.
``every_n=2`` checkpoints the 1st, 3rd, 5th... block only, for a middle ground.

``selective`` checkpoints the same blocks with a policy by op (selective.py): the outputs
of the ops that are expensive to recompute (``save``: matmuls, attention, convolutions) are
kept, the cheap rest (norms, activations, casts, copies) is recomputed in backward, and so
are matmuls that widen their input more than ``recompute_wider_than`` times (a
transformer MLP's 4x up-projection: its output is the largest activation of a block);
``saved_activation_bytes`` counts the kept outputs too.

This module holds the plugin: its settings' checks and its hooks; blocks.py which blocks
and how they run under checkpoint; selective.py what ``selective`` keeps.

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

import logging

from torch import nn

from tuneup import TuneupError, hookimpl
from tuneup.plugins.activation_checkpointing.blocks import (
    checkpoint_blocks,
    is_checkpointed,
    select_blocks,
)
from tuneup.plugins.activation_checkpointing.selective import SAVE_KINDS, SavePolicy
from tuneup.trainer.validation import Integer, Number, OneOf, problem, problems

log = logging.getLogger(__name__)

CHOICES = ("blocks", "selective")
#: What is imported from the plugin by name (the tests: the blocks wrapped, the policy).
__all__ = ["Plugin", "SavePolicy", "checkpoint_blocks", "is_checkpointed", "select_blocks"]


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
