"""Building a model without its parameters' memory: ``strategy=fsdp`` builds it so, shards
it, and only then materialises each process's shard (plugins/strategy/materialize.py).

Inside :func:`empty_parameters` every parameter lands on the meta device as a module
registers it; buffers stay real. ``torch.device("meta")`` would put the buffers there too,
and with them what ``__init__`` computed into them (position ids, BatchNorm's running
statistics, rotary frequencies), which neither ``reset_parameters`` nor a checkpoint (a
non-persistent buffer is not in it) gives back. This is Accelerate's
``init_empty_weights(include_buffers=False)``; Accelerate is not a dependency of tuneup.
A parameter's full storage exists only while its module registers it (``torch.empty``
memory that is never written, so none of it is resident).

A model builder (the zoo's, model=huggingface's) may ask :func:`building_empty` to skip work
that needs real parameters, such as reading pretrained weights: the strategy fills the
shards afterwards (``Settings.weights``, plugins/strategy/parallelize.py).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn

_state = threading.local()


def building_empty() -> bool:
    """Whether the model being built now is built empty (its parameters on the meta device)."""
    return getattr(_state, "empty", False)


@contextmanager
def empty_parameters() -> Iterator[None]:
    """Parameters registered inside go to the meta device; buffers stay where they are made."""
    register = nn.Module.register_parameter

    def on_meta(module, name, param):
        if param is not None and not param.is_meta:
            param = type(param)(param.to("meta"), requires_grad=param.requires_grad)
        register(module, name, param)

    nn.Module.register_parameter = on_meta
    _state.empty = True
    try:
        yield
    finally:
        nn.Module.register_parameter = register
        _state.empty = False


def wanted(cfg, weights_loaded_first: bool = False) -> bool:
    """Whether the run builds its model empty: ``strategy.init`` set and not ``full`` (only
    ``strategy=fsdp`` has it), unless weights are loaded into the model before training
    (``resume_weights_only``, ``mode=validate``: they need the real parameters)."""
    from omegaconf import OmegaConf

    init = OmegaConf.select(cfg, "strategy.init", default=None)
    return init not in (None, "full") and not weights_loaded_first
