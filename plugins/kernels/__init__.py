"""tuneup's own GPU kernel ops: fused LAMB and LARS, fused cross-entropy, chunked linear + CE.

Each op is a ``torch.library`` custom op (namespace ``tuneup``) with a plain-PyTorch reference
(the CPU path and the test oracle), a Triton kernel for CUDA tensors, autograd and a fake
implementation for torch.compile. ``implementation(device)`` says which one an op will run;
``ran`` records, per op name, which ones actually ran. See triton_support for running the
kernels on CPU under Triton's interpreter.

``Plugin`` (plugins/kernels/plugin.py) is the hook layer behind ``kernels=[...]``.

``cross_entropy`` and ``linear_cross_entropy`` here are the functions, which shadow their
modules as attributes of this package; reach a module (e.g. for its custom op,
``cross_entropy_op``) with ``importlib.import_module("tuneup.plugins.kernels.cross_entropy")``.
"""

from .cross_entropy import cross_entropy
from .lamb import Lamb
from .lars import Lars
from .linear_cross_entropy import linear_cross_entropy
from .plugin import Plugin
from .triton_support import REFERENCE, TRITON, implementation, ran, triton_on_cpu

__all__ = [
    "REFERENCE",
    "TRITON",
    "Lamb",
    "Lars",
    "Plugin",
    "cross_entropy",
    "implementation",
    "linear_cross_entropy",
    "ran",
    "triton_on_cpu",
]
