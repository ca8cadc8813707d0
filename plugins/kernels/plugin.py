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

``kernels.backend=liger`` runs Liger-Kernel's ops instead of ours (plugins/kernels/liger.py):
the same swaps, their kernels; ``liger`` in the summary. CUDA only, a check error elsewhere.
"""

from __future__ import annotations

from torch import nn
from torch.nn import functional as F

from tuneup import TuneupError, hookimpl
from tuneup.trainer.validation import BOOL, Integer, Number, OneOf, problems

from . import liger, triton_support
from .cross_entropy import cross_entropy
from .linear_cross_entropy import linear_cross_entropy

OPS = ("cross_entropy", "linear_cross_entropy")
#: Whose kernels run the ops: tuneup's own, or Liger-Kernel's.
BACKENDS = ("tuneup", liger.BACKEND)


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
    def loss(logits, target, **override):  # override: e.g. label_smoothing (its plugin's)
        return cross_entropy(logits.flatten(0, -2), target.flatten(), **{**settings, **override})

    return loss


def fused_linear_cross_entropy(head: OutputHead, settings):
    chunk = settings.get("chunk_size")
    options = {k: settings[k] for k in ("label_smoothing", "ignore_index") if k in settings}

    def loss(hidden, target, **override):  # override: e.g. label_smoothing (its plugin's)
        return linear_cross_entropy(
            hidden.flatten(0, -2),
            head.weight,
            target.flatten(),
            head.bias,
            chunk_size=chunk,
            **{**options, **override},
        )

    return loss


RULES = {
    "kernels.backend": OneOf(BACKENDS),
    "kernels.require_triton": BOOL,
    "kernels.ops.cross_entropy.label_smoothing": Number(ge=0, lt=1),
    "kernels.ops.cross_entropy.ignore_index": Integer(),
    "kernels.ops.linear_cross_entropy.label_smoothing": Number(ge=0, lt=1),
    "kernels.ops.linear_cross_entropy.ignore_index": Integer(),
    "kernels.ops.linear_cross_entropy.chunk_size": Integer(low=1, also=(None,)),
}


def contract_problems(ops, plan) -> list[str]:
    """Where the fused loss ops cannot stand in for the run's loss: a model that computes its
    own loss, classes not on the last dim, or no ``nn.Linear`` output head at ``head``."""
    chosen = f"kernels=[{','.join(ops)}]"
    if plan.lightning:
        return [
            f"{chosen} cannot apply to model=lightning: the LightningModule {plan.model_name} "
            "computes its own loss in training_step, which the fused loss ops cannot "
            "replace; remove kernels, or train its network with model=custom"
        ]
    if not plan.sound:
        return []  # the core reports what is wrong with the model or the data
    if plan.task.model_loss:
        return [
            f"{chosen} swaps the loss, but with task=model_loss the model computes its own; "
            "remove kernels, or return logits and use task=classification|next_token"
        ]
    output = plan.output() if plan.meta_model() is not None else None
    if plan.task.name == "classification" and output is not None and output.dim() > 2:
        return [
            f"{chosen} computes cross-entropy over the last dim, but model {plan.model_name} "
            f"outputs {list(output.shape)} with the classes on dim 1 (task=classification); "
            "remove kernels for this model"
        ]
    if "linear_cross_entropy" not in ops or plan.meta_model() is None:
        return []
    path = ops["linear_cross_entropy"].get("head", "lm_head")
    parent_path, _, name = path.rpartition(".")
    try:
        head = getattr(plan.meta_model().get_submodule(parent_path), name, None)
    except AttributeError:
        head = None
    if not isinstance(head, nn.Linear):
        found = type(head).__name__ if head is not None else "nothing"
        return [
            f"kernels.ops.linear_cross_entropy.head={path!r}: model {plan.model_name} has "
            f"{found} there, not an nn.Linear; set it to the attribute path of the layer "
            "that makes the logits"
        ]
    if output is not None and output.shape[-1] != head.out_features:
        return [
            f"kernels.ops.linear_cross_entropy.head={path!r} makes {head.out_features} "
            f"outputs, but model {plan.model_name}'s logits have {output.shape[-1]}: the "
            "head must be the model's last layer"
        ]
    return []


class Plugin:
    def __init__(self, cfg) -> None:
        self.ops = dict(cfg.kernels.get("ops") or {})
        self.backend = cfg.kernels.get("backend", "tuneup")
        self.head: OutputHead | None = None
        self.head_path: str | None = None
        self.device = None

    @hookimpl
    def check(self, cfg, env, plan):
        found = problems(cfg, RULES)
        unknown = set(self.ops) - set(OPS)
        if unknown:
            found.append(f"kernels.ops has {sorted(unknown)}; the ops are: {', '.join(OPS)}")
        if not self.ops:
            found.append("kernels: no op chosen; use e.g. kernels=[cross_entropy]")
        chosen = triton_support.implementation(env.accelerator)
        if self.backend == liger.BACKEND:
            found += liger.problems(env.accelerator)
            chunk = (self.ops.get("linear_cross_entropy") or {}).get("chunk_size")
            if chunk is not None:
                found.append(
                    f"kernels.ops.linear_cross_entropy.chunk_size={chunk} sets tuneup's "
                    "chunks; Liger-Kernel picks its own: remove it, or use "
                    "kernels.backend=tuneup"
                )
        elif cfg.kernels.get("require_triton") and chosen != triton_support.TRITON:
            found.append(
                f"kernels.require_triton=true, but on {env.accelerator} the ops run "
                f"their {chosen} implementation (Triton kernels need CUDA and the "
                "tuneup[kernels] extra)"
            )
        if not found:
            found += contract_problems(self.ops, plan)
        return found

    @hookimpl(tryfirst=True)  # kernel swaps come first: later transforms see the final modules
    def configure_model(self, model):
        if "linear_cross_entropy" in self.ops:
            self.head_path = self.ops["linear_cross_entropy"].get("head", "lm_head")
            self.head = fuse_output_head(model, self.head_path)

    @hookimpl
    def on_fit_start(self, module):
        self.device = module.device
        triton_support.ran.clear()
        ours = self.backend != liger.BACKEND
        if self.head is not None:
            settings = {k: v for k, v in self.ops["linear_cross_entropy"].items() if k != "head"}
            make = fused_linear_cross_entropy if ours else liger.linear_cross_entropy
            module.loss_fn = make(self.head, settings)
            module.logits_fn = self.head.logits
        else:
            make = fused_cross_entropy if ours else liger.cross_entropy
            module.loss_fn = make(dict(self.ops["cross_entropy"]))

    @hookimpl
    def report(self, summary):
        ran = {op: sorted(triton_support.ran.get(op, ())) for op in self.ops}
        if self.head is not None and "cross_entropy" in self.ops:
            # linear_cross_entropy runs the cross-entropy rows kernel on each chunk itself
            ran["cross_entropy"] = ran["linear_cross_entropy"]
        summary["kernels"] = ran

    def describe(self):
        expected = triton_support.implementation(self.device or "cpu")
        if self.backend == liger.BACKEND:
            expected = f"{liger.BACKEND} {liger.version()}"
        settings = {
            "backend": self.backend,
            "ops": {op: dict(s) for op, s in self.ops.items()},
            "implementation": expected,
        }
        if self.head is not None:  # which module of the model the fused head + loss replaced
            weight = self.head.weight
            settings["swapped"] = (
                f"{self.head_path} (Linear {weight.shape[1]} -> {weight.shape[0]})"
            )
        return settings
