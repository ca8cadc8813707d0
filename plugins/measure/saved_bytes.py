"""saved_activation_bytes: the bytes autograd keeps for backward during one micro-batch's forward.

A saved-tensors pack hook counting storages once (the measure plugin, plugins/measure/,
opens it on the ``SAVED_BYTES_MICRO_BATCH``-th micro-batch and stops it before backward).
Apart from the plugin because it is its own mechanism: autograd's hooks, not timing.
"""

from __future__ import annotations

import torch

#: The training micro-batch (0-based, counted over the run) whose forward is measured for
#: saved_activation_bytes: the 2nd, so the first step's one-time work is not in it.
SAVED_BYTES_MICRO_BATCH = 1


class SavedActivationBytes:
    """Counts the bytes autograd saves for backward while active (a saved-tensors pack hook).

    Every tensor an op saves for backward passes through the pack hook. Storages
    are counted once (keyed by data pointer: views and a tensor saved by two ops
    are one allocation), and the model's parameters and buffers are left out
    (they stay in memory anyway). Hooks nest innermost-wins, so inside a block
    under non-reentrant activation checkpointing the checkpoint's own hooks take
    over and what it drops is not counted, while the block inputs it keeps are
    saved outside them and are counted: the total is what is really kept.
    """

    def __init__(self, module) -> None:
        tensors = (*module.parameters(), *module.buffers())
        self.exclude = {key[0] for t in tensors if (key := storage_of(t)) is not None}
        self.storages: dict[int, int] = {}
        self.hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self.hooks.__enter__()

    def _pack(self, tensor):
        key = storage_of(tensor)
        if key is not None and key[0] not in self.exclude:
            self.storages[key[0]] = key[1]
        return tensor.detach()  # not the tensor itself: that would make a reference cycle

    def stop(self) -> int:
        self.hooks.__exit__(None, None, None)
        return sum(self.storages.values())


def storage_of(tensor) -> tuple[int, int] | None:
    """(data pointer, bytes) of the memory behind ``tensor``: a DTensor's local shard; None for
    a tensor without storage of its own (FSDP2's unsharded parameters between all-gathers)."""
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    try:
        storage = local.untyped_storage()
        return storage.data_ptr(), storage.nbytes()
    except (RuntimeError, NotImplementedError):
        return None
