"""Which parameters weight decay applies to: ``weight_decay=all|skip_norms_biases``.

``skip_norms_biases`` puts the weights of normalisation layers (BatchNorm, LayerNorm,
GroupNorm, RMSNorm... by module type, and any module class named ``*Norm``, e.g. a Hugging
Face ``LlamaRMSNorm``) and every bias (a parameter of one dimension or none) into a parameter
group with ``weight_decay=0``; the others keep ``optimizer.weight_decay``. Decay pulls a norm's
scale toward zero without making the function simpler (the next layer can undo the scale), so
FFCV's and MLPerf's ResNet-50 recipes and nanoGPT leave norms and biases out.

It acts through the ``configure_param_groups`` hook, before any optimizer is built, so every
optimizer gets the groups: ``sgd`` and ``adamw`` (trainer/optim.py), ``lamb`` and ``lars``,
fused or not (plugins/large_batch.py; those already skip weight decay on tensors of ndim <= 1,
which is the same set for the zoo's models), an installed plugin's. Under ``strategy=fsdp``
the parameters are DTensors whose ``ndim`` is the full tensor's, so the groups are the same
as in one process.
"""

from __future__ import annotations

from torch import nn

from tuneup import hookimpl

#: torch's normalisation layers; a module class whose name ends in "Norm" counts too.
NORMS = (
    nn.modules.batchnorm._NormBase,  # BatchNorm*d, SyncBatchNorm, InstanceNorm*d
    nn.LayerNorm,
    nn.GroupNorm,
    nn.LocalResponseNorm,
    nn.RMSNorm,
)


def is_norm(module: nn.Module) -> bool:
    return isinstance(module, NORMS) or type(module).__name__.endswith("Norm")


def skips_decay(model: nn.Module) -> set[int]:
    """``id`` of each parameter that gets no weight decay: norm weights and biases."""
    norms = {id(p) for m in model.modules() if is_norm(m) for p in m.parameters(recurse=False)}
    return norms | {id(p) for p in model.parameters() if p.ndim <= 1}


def param_groups(model: nn.Module, params) -> list[dict]:
    """``params`` (tensors, or groups of them) split so that norms and biases are in groups
    with ``weight_decay=0.0``; each group's other options are kept. Empty groups are left out."""
    skip = skips_decay(model)
    groups = params if params and isinstance(params[0], dict) else [{"params": list(params)}]
    split = []
    for group in groups:
        options = {k: v for k, v in group.items() if k != "params"}
        decay = [p for p in group["params"] if id(p) not in skip]
        plain = [p for p in group["params"] if id(p) in skip]
        split += [{"params": decay, **options}] if decay else []
        split += [{"params": plain, **options, "weight_decay": 0.0}] if plain else []
    return split


class Plugin:
    def __init__(self) -> None:
        self.counts: dict | None = None

    @hookimpl
    def check(self, plan):
        if plan is not None and plan.lightning:
            return [
                f"weight_decay=skip_norms_biases cannot apply to model=lightning: the "
                f"LightningModule {plan.model_name} builds its own optimizer in "
                "configure_optimizers; make the groups there, or remove weight_decay="
            ]
        return []

    @hookimpl
    def configure_param_groups(self, params, model):
        groups = param_groups(model, params)
        skipped = sum(
            p.numel() for g in groups if g.get("weight_decay") == 0.0 for p in g["params"]
        )
        self.counts = {
            "no_decay_tensors": sum(
                len(g["params"]) for g in groups if g.get("weight_decay") == 0.0
            ),
            "no_decay_elements": skipped,
        }
        return groups

    def describe(self):
        return {"name": "skip_norms_biases", **(self.counts or {})}
