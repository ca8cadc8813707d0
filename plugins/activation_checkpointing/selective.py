"""What ``activation_checkpointing=selective`` keeps: the policy by op, and the kept tensors
shown to the saved-tensor hook.

torch's selective checkpoint contexts (``create_selective_checkpoint_contexts``) ask a
policy, op by op, whether to keep an output or recompute it in backward. :class:`SavePolicy`
keeps the outputs of the ops named by ``save`` (matmuls, attention, convolutions: expensive
to recompute) and recomputes the cheap rest (norms, activations, casts, copies), and the
matmuls that widen their input more than ``recompute_wider_than`` times (:func:`widening`).

Those kept outputs live in the checkpoint's own cache, where saved-tensor hooks do not see
them; :func:`show_kept` passes them to the hook active outside the block, so the summary's
``saved_activation_bytes`` counts them. The block wrapping that uses both is in this
package's ``__init__`` (``CheckpointedForward``).
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

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
