"""``kernels.backend=liger``: the loss ops from Liger-Kernel instead of tuneup's own.

Liger-Kernel (``pip install liger-kernel``, or ``tuneup[liger]``) is the library most people
use for these fusions: Triton kernels for cross-entropy and chunked linear + cross-entropy.
Offered where it is faster than ours (bench/kernels.py times both, docs/benchmarks.md has
the figures), rather than a slower kernel of our own. Same semantics as our ops (mean over
the rows not ignored, label smoothing), with two differences a user may notice:

- Liger's kernels need CUDA tensors (they have no CPU path): on CPU the backend is a check
  error, not a fallback to our reference.
- Liger's linear + cross-entropy accumulates the weight gradient across chunks in the
  weight's dtype unless told otherwise; it is told to use fp32, like ours, where the
  installed version has the option (``accum_dtype``).
- Liger's cross-entropy writes the gradient over the logits, in place, in forward. Right when
  the op that made the logits does not keep them for its own backward (a Linear head, as in
  model=gpt); a model that squashes its logits (``tanh`` soft-capping keeps its output) would
  get wrong gradients without an error: use ``kernels.backend=tuneup`` there. Its backward
  skips the scaling by the incoming gradient when that is 1 (a host synchronisation), and
  scales in place otherwise, so a second backward over the same graph compounds the scale.
"""

from __future__ import annotations

import importlib.metadata
import inspect

import torch

from . import triton_support
from .linear_cross_entropy import cast_like_linear

BACKEND = "liger"
#: The oldest Liger-Kernel whose functional API (liger_kernel.transformers.functional) has both ops.
MIN_VERSION = "0.5"


def version() -> str | None:
    try:
        return importlib.metadata.version("liger-kernel")
    except importlib.metadata.PackageNotFoundError:
        return None


def problems(accelerator: str) -> list[str]:
    """Why kernels.backend=liger cannot run here: not installed, or no CUDA."""
    found = []
    if version() is None:
        found.append(
            "kernels.backend=liger runs Liger-Kernel's ops, and liger-kernel is not "
            "installed: pip install 'tuneup[liger]', or use kernels.backend=tuneup"
        )
    if accelerator != "cuda":
        found.append(
            f"kernels.backend=liger runs Liger-Kernel's Triton kernels, which need a "
            f"CUDA GPU, and this run is on {accelerator}: use kernels.backend=tuneup "
            "(its plain-PyTorch reference runs on CPU)"
        )
    return found


def _functional():
    from liger_kernel.transformers import functional

    return functional


def _loss(result):
    """The loss of a Liger op's result: a tensor, or (older and newer versions with extra
    outputs asked for) a tuple or an output object holding it."""
    if isinstance(result, torch.Tensor):
        return result
    return result.loss if hasattr(result, "loss") else result[0]


def cross_entropy(settings: dict):
    """A loss function ``(logits, target)`` running Liger's cross-entropy."""
    options = {k: settings[k] for k in ("label_smoothing", "ignore_index") if k in settings}

    def loss(logits, target, **override):  # override: e.g. label_smoothing (its plugin's)
        triton_support.record("cross_entropy", BACKEND)
        result = _functional().liger_cross_entropy(
            logits.flatten(0, -2), target.flatten(), reduction="mean", **{**options, **override}
        )
        return _loss(result)

    return loss


def linear_cross_entropy(head, settings: dict):
    """A loss function ``(hidden, target)`` running Liger's fused linear + cross-entropy over
    the weights of ``head`` (the plugin's OutputHead)."""
    options = {k: settings[k] for k in ("label_smoothing", "ignore_index") if k in settings}
    function = _functional().liger_fused_linear_cross_entropy
    if "accum_dtype" in inspect.signature(function).parameters:
        options["accum_dtype"] = torch.float32  # the weight gradient summed in fp32, as ours

    def loss(hidden, target, **override):  # override: e.g. label_smoothing (its plugin's)
        triton_support.record("linear_cross_entropy", BACKEND)
        # Liger's function is not an autocast op: cast as F.linear would be under autocast.
        hidden, weight, bias = cast_like_linear(hidden.flatten(0, -2), head.weight, head.bias)
        options_now = {**options, **override}
        return _loss(
            function(hidden, weight, target.flatten(), bias, reduction="mean", **options_now)
        )

    return loss
