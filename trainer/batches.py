"""What a batch looks like: its first tensor, its kind (tokens, images), its meta copy."""

from __future__ import annotations

import torch


def to_meta(batch):
    """``batch`` with every tensor replaced by an empty one of its shape on the meta device."""
    if isinstance(batch, torch.Tensor):
        return torch.empty_like(batch, device="meta")
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_meta(item) for item in batch)
    if isinstance(batch, dict):
        return {key: to_meta(value) for key, value in batch.items()}
    return batch


def first_tensor(batch) -> torch.Tensor | None:
    if isinstance(batch, torch.Tensor):
        return batch
    items = batch.values() if isinstance(batch, dict) else batch
    if isinstance(items, (list, tuple, type({}.values()))):
        for item in items:
            if (found := first_tensor(item)) is not None:
                return found
    return None


def samples_in(batch, world_size: int) -> int:
    """The samples one training batch holds over all ``world_size`` processes (each process's
    batches have the same size: the training loaders make full batches only)."""
    first = first_tensor(batch)
    return (len(first) if first is not None else 0) * world_size


def input_kind(x: torch.Tensor | None) -> str | None:
    """What a batch's input is: token ids ``[B, T]``, images ``[B, C, H, W]``, or unknown."""
    if x is None:
        return None
    if x.dim() == 2 and not x.is_floating_point():
        return "tokens"
    return "images" if x.dim() == 4 and x.is_floating_point() else None


def pair(batch) -> bool:
    return isinstance(batch, (tuple, list)) and len(batch) == 2


def describe(batch) -> str:
    if isinstance(batch, torch.Tensor):
        return f"a tensor {list(batch.shape)}"
    if isinstance(batch, dict):
        return "a dict of " + ", ".join(f"{k} {describe(v)}" for k, v in batch.items())
    if isinstance(batch, (list, tuple)):
        return f"a {type(batch).__name__} of " + ", ".join(describe(b) for b in batch)
    return type(batch).__name__
