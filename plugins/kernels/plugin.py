"""The hook layer of ``kernels=[cross_entropy,linear_cross_entropy]``: swap the fused ops in.

- ``cross_entropy``: the training loss becomes :func:`plugins.kernels.cross_entropy`
  (gradient computed in the forward kernel, no fp32 copy of the logits).
- ``linear_cross_entropy``: the model's output head (``head``, default ``lm_head``) stops
  producing logits; the loss :func:`plugins.kernels.linear_cross_entropy` computes head and
  cross-entropy chunk by chunk, so the [tokens, vocabulary] logits never exist in training.
  Validation still computes logits (for accuracy) from the same head weights. With both ops
  chosen, linear_cross_entropy is the loss; it runs the fused cross-entropy rows kernel on each
  chunk of logits.

The summary says, per op, which implementation actually ran (``triton`` on CUDA with the
``tuneup[kernels]`` extra, else ``reference``); ``kernels.require_triton=true`` makes the
reference path a check error instead of a fallback.
"""

from __future__ import annotations

from torch import nn
from torch.nn import functional as F

from trainer import TuneupError, hookimpl
from trainer.validation import BOOL, Integer, Number, problems

from . import triton_support
from .cross_entropy import cross_entropy
from .linear_cross_entropy import linear_cross_entropy

OPS = ("cross_entropy", "linear_cross_entropy")


class OutputHead(nn.Module):
    """Stands where the model's logits head was: passes hidden states through.

    Holds the head's own ``weight`` (and ``bias``) under the same names, so the
    parameters, their tying and the state-dict keys stay exactly as they were.
    """

    def __init__(self, head: nn.Linear) -> None:
        super().__init__()
        self.weight = head.weight
        self.bias = head.bias

    def forward(self, hidden):
        return hidden

    def logits(self, hidden):
        return F.linear(hidden, self.weight, self.bias)


def fuse_output_head(model: nn.Module, path: str) -> OutputHead:
    """Replace the ``nn.Linear`` at attribute ``path`` of ``model`` with an :class:`OutputHead`."""
    parent_path, _, name = path.rpartition(".")
    parent = model.get_submodule(parent_path) if parent_path else model
    head = getattr(parent, name, None)
    if isinstance(head, OutputHead):
        return head
    if not isinstance(head, nn.Linear):
        raise TuneupError(
            f"kernels.ops.linear_cross_entropy.head={path!r}: the model has no nn.Linear there "
            f"(found {type(head).__name__}); set it to the attribute path of the output layer"
        )
    fused = OutputHead(head)
    setattr(parent, name, fused)
    return fused


def fused_cross_entropy(settings):
    def loss(logits, target):
        return cross_entropy(logits.flatten(0, -2), target.flatten(), **settings)

    return loss


def fused_linear_cross_entropy(head: OutputHead, settings):
    chunk = settings.get("chunk_size")
    options = {k: settings[k] for k in ("label_smoothing", "ignore_index") if k in settings}

    def loss(hidden, target):
        return linear_cross_entropy(hidden.flatten(0, -2), head.weight, target.flatten(),
                                    head.bias, chunk_size=chunk, **options)  # fmt: skip

    return loss


RULES = {
    "kernels.require_triton": BOOL,
    "kernels.ops.cross_entropy.label_smoothing": Number(ge=0, lt=1),
    "kernels.ops.cross_entropy.ignore_index": Integer(),
    "kernels.ops.linear_cross_entropy.label_smoothing": Number(ge=0, lt=1),
    "kernels.ops.linear_cross_entropy.ignore_index": Integer(),
    "kernels.ops.linear_cross_entropy.chunk_size": Integer(low=1, also=(None,)),
}


class Plugin:
    def __init__(self, cfg) -> None:
        self.ops = dict(cfg.kernels.get("ops") or {})
        self.head: OutputHead | None = None
        self.device = None

    @hookimpl
    def check(self, cfg, env):
        found = problems(cfg, RULES)
        unknown = set(self.ops) - set(OPS)
        if unknown:
            found.append(f"kernels.ops has {sorted(unknown)}; the ops are: {', '.join(OPS)}")
        if not self.ops:
            found.append("kernels: no op chosen; use e.g. kernels=[cross_entropy]")
        chosen = triton_support.implementation(env.accelerator)
        if cfg.kernels.get("require_triton") and chosen != triton_support.TRITON:
            found.append(f"kernels.require_triton=true, but on {env.accelerator} the ops run "
                         f"their {chosen} implementation (Triton kernels need CUDA and the "
                         "tuneup[kernels] extra)")  # fmt: skip
        return found

    @hookimpl(tryfirst=True)  # kernel swaps come first: later transforms see the final modules
    def configure_model(self, model):
        if "linear_cross_entropy" in self.ops:
            path = self.ops["linear_cross_entropy"].get("head", "lm_head")
            self.head = fuse_output_head(model, path)

    @hookimpl
    def on_fit_start(self, module):
        self.device = module.device
        triton_support.ran.clear()
        if self.head is not None:
            settings = {k: v for k, v in self.ops["linear_cross_entropy"].items() if k != "head"}
            module.loss_fn = fused_linear_cross_entropy(self.head, settings)
            module.logits_fn = self.head.logits
        else:
            module.loss_fn = fused_cross_entropy(dict(self.ops["cross_entropy"]))

    @hookimpl
    def report(self, summary):
        ran = {op: sorted(triton_support.ran.get(op, ())) for op in self.ops}
        if self.head is not None and "cross_entropy" in self.ops:
            # linear_cross_entropy runs the cross-entropy rows kernel on each chunk itself
            ran["cross_entropy"] = ran["linear_cross_entropy"]
        summary["kernels"] = ran

    def describe(self):
        expected = triton_support.implementation(self.device or "cpu")
        return {"ops": {op: dict(s) for op, s in self.ops.items()}, "implementation": expected}
