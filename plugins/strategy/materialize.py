"""``strategy.init``: how a model built empty (trainer/empty_init.py: parameters on the meta
device, buffers real) gets its values once it is parallelised, each process materialising
only its shards (docs/distributed.md, "How the model is built").

- ``broadcast``: rank 0 builds the whole model from the run's seed, as one process does, and
  its weights go to every process's shards through torch's ``set_model_state_dict(...,
  StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))``; the other processes
  never hold more than their shards. The initial weights equal a one-process build exactly.
- ``reset_parameters``: each module's ``reset_parameters()``, in the order of
  ``model.modules()``, from the run's seed on every process.
- ``hf``: transformers' own initialisation (the model's ``_init_weights``, children before
  parents as ``PreTrainedModel.initialize_weights`` goes; not that method itself: the empty
  build ran it on the meta parameters and marked every module initialised).
- ``auto``: ``hf`` for a transformers model, else ``broadcast``: a module's
  ``reset_parameters`` is often not how its model initialises it (model=gpt draws N(0, 0.02),
  ``nn.Linear.reset_parameters`` a uniform of another width), so it is used when asked for.
- ``full``: nothing here; every process builds the whole model (trainer/build.py).

``reset_parameters`` and ``hf`` initialise each module whole on every process and keep the
process's shard (:func:`init_whole_then_shard`). Called on the sharded parameters instead (as
Lightning's ``_materialize_distributed_module`` and torchtitan do), a random init draws the
local shard from each process's own generator: on CPU, where DTensor has no RNG tracker
(torch 2.13), every process draws the same numbers, so the shards repeat each other; on
CUDA the tracker keeps them apart, but the values still differ from a one-process build.
Whole modules keep them equal to a one-process build when the model's initialisation is its
modules' own, in the order it registered them (tests/test_materialize.py); the memory is one
module's parameters at a time.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import nn

INITS = ("auto", "broadcast", "reset_parameters", "hf", "full")


def is_transformers_model(model: nn.Module) -> bool:
    return any(
        c.__name__ == "PreTrainedModel" and c.__module__.startswith("transformers")
        for c in type(model).__mro__
    )


def choose(init: str, model: nn.Module) -> str:
    """``strategy.init`` for ``model``: ``auto`` resolved (see the module's docstring)."""
    if init != "auto":
        return init
    return "hf" if is_transformers_model(model) else "broadcast"


#: What initialises the shards, in words, for the start-up line ("... initialised by ...").
SAID = {
    "broadcast": "rank 0's whole build of the model, sent to every process",
    "reset_parameters": "each module's own reset_parameters()",
    "hf": "the Hugging Face model's own initialisation (its _init_weights, module by module)",
}


def reason(init: str, model: nn.Module) -> str:
    """What :func:`choose` chose, in words, and why, for the start-up line."""
    chosen = choose(init, model)
    said = SAID.get(chosen, chosen)
    if init != "auto":
        return f"{said} (strategy.init={init})"
    what = "a transformers model" if chosen == "hf" else "not a transformers model"
    return f"{said} (strategy.init=auto: {what})"


def uninitialised(init: str, model: nn.Module) -> list[str]:
    """Classes of modules with parameters that ``init=reset_parameters`` could not initialise."""
    if init != "reset_parameters":
        return []
    return sorted(
        {
            type(m).__name__
            for m in model.modules()
            if any(True for _ in m.parameters(recurse=False))
            and not callable(getattr(m, "reset_parameters", None))
        }
    )


def has_empty(model: nn.Module) -> bool:
    return any(t.is_meta for t in [*model.parameters(), *model.buffers()])


def to_device(model: nn.Module, device) -> None:
    """Storage for the meta tensors (uninitialised); real buffers stay as they are. FSDP2's
    ``_apply`` re-registers its sharded parameters afterwards (as for ``to_empty``)."""
    model._apply(lambda t: torch.empty_like(t, device=device) if t.is_meta else t)


def materialize(
    model: nn.Module,
    device,
    init: str,
    seed: int = 0,
    weights: Callable[[nn.Module], None] | None = None,
    build: Callable[[], nn.Module] | None = None,
) -> str | None:
    """Give the parallelised ``model``'s empty parameters their values in place; returns how
    (``weights`` when ``weights`` filled them), or None when nothing was empty."""
    if not has_empty(model):
        return None
    chosen = choose(init, model)
    if weights is None and chosen == "broadcast":
        broadcast(model, device, build)
        return chosen
    to_device(model, device)
    if weights is not None:
        weights(model)
        return "weights"
    with torch.no_grad(), seeded(seed):
        if chosen == "reset_parameters":
            done: set[int] = set()
            for module in model.modules():
                if callable(getattr(module, "reset_parameters", None)):
                    init_whole_then_shard(module, type(module).reset_parameters, done)
        elif chosen == "hf":
            done = set()
            for module, owner in hf_order(model, model):
                init_whole_then_shard(module, owner._init_weights, done)
        else:
            raise ValueError(f"strategy.init={init!r}: expected one of {', '.join(INITS)}")
    return chosen


def broadcast(model: nn.Module, device, build: Callable[[], nn.Module] | None) -> None:
    """Rank 0's whole build into every process's shards (torch's ``broadcast_from_rank0``)."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    full = {}
    if not dist.is_initialized() or dist.get_rank() == 0:
        if build is None:
            raise ValueError("strategy.init=broadcast needs the model's builder (Settings.build)")
        full = build().state_dict()
    to_device(model, device)
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, full, options=options)


def init_whole_then_shard(
    module: nn.Module, init: Callable[[nn.Module], None], done: set[int]
) -> None:
    """``init(module)`` on whole, plain copies of its own parameters, then each process's shard
    of them copied into the parameters (a parameter in ``done``, one tied to a module seen
    before, keeps its value: as in a model that ties it after building both modules)."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    own = {name: p for name, p in module._parameters.items() if p is not None}
    whole = {
        name: nn.Parameter(
            torch.empty(p.shape, dtype=p.dtype, device=_local(p).device),
            requires_grad=p.requires_grad,
        )
        for name, p in own.items()
    }
    module._parameters.update(whole)
    try:
        init(module)
        whole = {name: module._parameters[name] for name in own}
    finally:
        module._parameters.update(own)
    for name, p in own.items():
        if id(p) in done:
            continue
        done.add(id(p))
        value = whole[name].detach()
        if isinstance(p, DTensor):  # every process holds the same whole value: no communication
            value = distribute_tensor(value, p.device_mesh, p.placements, src_data_rank=None)
            value = value.to_local()
        _local(p).copy_(value)


def _local(p: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return p.to_local() if isinstance(p, DTensor) else p


def hf_order(module: nn.Module, owner: nn.Module) -> Iterator[tuple[nn.Module, nn.Module]]:
    """(module, the transformers model whose ``_init_weights`` applies), children first: the
    order of ``PreTrainedModel.initialize_weights``, each sub-model initialising its own."""
    for child in module.children():
        yield from hf_order(child, child if is_transformers_model(child) else owner)
    yield module, owner


@contextmanager
def seeded(seed: int) -> Iterator[None]:
    """The run's seed for the block (trainer/build.py's ``seed_everything`` before it builds), then
    the random state as it was: what runs after initialisation draws as it would have."""
    import numpy as np

    saved = random.getstate(), np.random.get_state()
    devices = range(torch.cuda.device_count()) if torch.cuda.is_initialized() else []
    with torch.random.fork_rng(devices=devices):
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)
        try:
            yield
        finally:
            random.setstate(saved[0])
            np.random.set_state(saved[1])


def seeded_build(build: Callable[[], nn.Module], seed: int) -> Callable[[], nn.Module]:
    """``build`` as trainer/build.py calls it: after the run's seed."""

    def whole() -> nn.Module:
        with seeded(seed):
            return build()

    return whole
