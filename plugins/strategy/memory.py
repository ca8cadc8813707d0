"""Per-rank figures of a distributed run: what each process holds and what it sends.

- Bytes of parameters, gradients and optimizer state each process holds after that step,
  summed from the tensors themselves (a DTensor counts its local shard: what sharding leaves on this
  process), not from a formula: :func:`held_bytes`.
- Bytes all-gathered, reduce-scattered and all-reduced in the run's first optimizer step
  (all its micro-batches), counted from the collectives torch.distributed really issues, seen as
  operators by a dispatch mode (:class:`Collectives`): FSDP2's parameter all-gathers and
  gradient reduce-scatters, DDP's all-reduces, tensor parallelism's all-reduces.
- The process's peak memory (CUDA allocator peak, or peak RSS on CPU).

Each rank measures its own; the figures are gathered to rank 0 at the end of training and
written under ``per_rank`` in summary.json.
"""

from __future__ import annotations

from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

#: Collective operators by kind, and which of their arguments holds the bytes that travel
#: (None: the result). ``c10d``: torch.distributed's own (FSDP2, DDP); ``_c10d_functional``:
#: DTensor's (tensor parallelism).
FUNCTIONAL = {
    "all_gather_into_tensor": ("all_gather", None),
    "all_gather_into_tensor_coalesced": ("all_gather", None),
    "reduce_scatter_tensor": ("reduce_scatter", 0),
    "reduce_scatter_tensor_coalesced": ("reduce_scatter", 0),
    "all_reduce": ("all_reduce", 0),
    "all_reduce_coalesced": ("all_reduce", 0),
}
KINDS = {
    "_allgather_base_": ("all_gather", 0),  # output: the gathered whole
    "allgather_": ("all_gather", 0),
    "allgather_into_tensor_coalesced_": ("all_gather", 0),
    "_reduce_scatter_base_": ("reduce_scatter", 1),  # input: what is reduced
    "reduce_scatter_": ("reduce_scatter", 1),
    "reduce_scatter_tensor_coalesced_": ("reduce_scatter", 1),
    "allreduce_": ("all_reduce", 0),
    "allreduce_coalesced_": ("all_reduce", 0),
}


def local_bytes(tensor) -> int:
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return local.numel() * local.element_size()


def _tensors(value):
    if torch.is_tensor(value):
        yield value
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _tensors(item)


def held_bytes(module: torch.nn.Module, optimizers) -> dict[str, int]:
    """Bytes of parameters, gradients (those present now) and optimizer state on this process."""
    params = list(module.parameters())
    state = [
        t for o in optimizers for s in o.state.values() for t in s.values() if torch.is_tensor(t)
    ]
    return {
        "parameter_bytes": sum(local_bytes(p) for p in params),
        "gradient_bytes": sum(local_bytes(p.grad) for p in params if p.grad is not None),
        "optimizer_state_bytes": sum(local_bytes(t) for t in state),
    }


class Collectives(TorchDispatchMode):
    """Counts the bytes of every c10d collective issued while active (this thread and the
    autograd threads it starts)."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        namespace, _, name = func.name().partition("::")
        table = {"c10d": KINDS, "_c10d_functional": FUNCTIONAL}.get(namespace, {})
        result = func(*args, **(kwargs or {}))
        if name in table:
            what, where = table[name]
            moved = result if where is None else args[where]
            self.bytes[what] += sum(local_bytes(t) for t in _tensors(moved))
        return result

    def figures(self) -> dict[str, int]:
        return {
            f"{kind}_bytes_per_step": self.bytes[kind]
            for kind in ("all_gather", "reduce_scatter", "all_reduce")
        }


def gather(trainer, figures: dict) -> list[dict]:
    """Every rank's ``figures``, in rank order (collective: every rank calls it)."""
    if trainer.world_size == 1 or not torch.distributed.is_initialized():
        return [figures]
    everyone = [None] * trainer.world_size
    torch.distributed.all_gather_object(everyone, figures)
    return everyone
