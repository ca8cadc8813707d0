"""Muon on the hidden matrices, AdamW on the rest: ``optimizer=muon``, as the modded-nanogpt
speedrun trains (Keller Jordan's Muon, ``torch.optim.Muon``).

Muon orthogonalises each 2-D weight's momentum with a few Newton-Schulz iterations before
applying it; it is meant for the hidden layers' matrices only. Which parameter goes where
(:func:`split`):

- **Muon**: the weight of every ``nn.Linear`` (and subclasses: fp8's ``Float8Linear``...),
  except the output layer's.
- **AdamW**: everything else: ``nn.Embedding`` weights (a tied output layer is one of them),
  the output layer, norms, biases, other parameters (a position table held as an
  ``nn.Parameter``, scalars) and convolution filters. The output layer is the last
  ``nn.Linear`` in the model's module order, unless ``optimizer.adamw_params`` lists name
  patterns (``fnmatch``, on the names of ``model.named_parameters()``, e.g. ``[head.*]``):
  then the matching parameters are the ones that go to AdamW besides the embeddings, norms
  and biases, and no layer is guessed.
- Convolution filters (4-D) stay with AdamW: ``torch.optim.Muon`` takes 2-D parameters
  only. airbench's CIFAR-10 record runs Muon on the flattened filters with its own
  implementation; here Muon pays on MLPs and transformers (docs/optimizers.md), and a model
  with no hidden ``nn.Linear`` (the zoo's ResNets) is refused rather than trained by AdamW alone.

Both run inside one ``torch.optim.Optimizer`` (:class:`MuonWithAdamW`): its param groups are
Muon's followed by AdamW's (each flagged ``use_muon``) and its state is theirs, so Lightning
sees one optimizer: the LR schedule scales both learning rates by the same factor, gradient
clipping and accumulation work on the model as for any optimizer, and the checkpoint holds
one ordinary optimizer state dict (flat groups, per-parameter tensors).

Under ``strategy=fsdp`` (FSDP2, tensor parallel) it is refused: Newton-Schulz needs each whole
matrix, and a DTensor parameter holds a shard. DDP is fine: every rank has the whole matrix
and the same averaged gradient.
"""

from __future__ import annotations

from fnmatch import fnmatch

import torch
from torch import nn

from tuneup import TuneupError, hookimpl
from tuneup.trainer.validation import BOOL, Integer, Number, OneOf, problems

RULES = {
    "optimizer.lr": Number(gt=0),
    "optimizer.momentum": Number(ge=0, lt=1),
    "optimizer.nesterov": BOOL,
    "optimizer.ns_steps": Integer(low=1, high=99),
    "optimizer.weight_decay": Number(ge=0),
    "optimizer.adjust_lr_fn": OneOf(("original", "match_rms_adamw")),
    "optimizer.adamw_lr": Number(gt=0),
    "optimizer.adamw_weight_decay": Number(ge=0),
}
#: Prefixes that wrappers (torch.compile, activation checkpointing) add to parameter names.
WRAPPERS = ("_orig_mod.", "_checkpoint_wrapped_module.")


def clean(name: str) -> str:
    for prefix in WRAPPERS:
        name = name.replace(prefix, "")
    return name


def split(model: nn.Module, adamw_params=None) -> tuple[set[int], set[int]]:
    """(``id``s of the parameters Muon trains, ``id``s of those named as AdamW's by
    ``adamw_params`` or guessed as the output layer); see the module's docstring."""
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    if adamw_params is None:
        named = {id(linears[-1].weight)} if linears else set()
    else:
        names = {clean(n): p for n, p in model.named_parameters()}
        unmatched = [pat for pat in adamw_params if not any(fnmatch(n, pat) for n in names)]
        if unmatched:
            shown = ", ".join(list(names)[:6])
            raise TuneupError(
                f"optimizer.adamw_params={list(adamw_params)}: {', '.join(unmatched)} matches "
                f"no parameter of the model (its parameters are named like {shown}); use "
                "fnmatch patterns of those names, or null to guess the output layer"
            )
        named = {id(p) for n, p in names.items() if any(fnmatch(n, pat) for pat in adamw_params)}
    hidden = {id(m.weight) for m in linears if m.weight.ndim == 2}
    return hidden - embeddings - named, named


def muon_parameters(model: nn.Module, adamw_params) -> set[int]:
    """:func:`split`'s Muon part; a model where it is empty is an error."""
    muon_ids, _ = split(model, list(adamw_params) if adamw_params is not None else None)
    if not muon_ids:
        raise TuneupError(
            f"optimizer=muon found no hidden nn.Linear weight in {type(model).__name__} (Muon "
            "trains nn.Linear weights but the output layer's; conv filters, embeddings, norms "
            "and biases go to AdamW): use optimizer=adamw, or optimizer.adamw_params=[...] if "
            "the last nn.Linear is not the output layer"
        )
    return muon_ids


class MuonWithAdamW(torch.optim.Optimizer):
    """``torch.optim.Muon`` on the groups flagged ``use_muon``, ``torch.optim.AdamW`` on the
    others; one optimizer to Lightning, one state dict. Either part may be empty."""

    def __init__(
        self, muon_groups: list[dict], adamw_groups: list[dict], muon: dict, adamw: dict
    ) -> None:
        self.parts: list[torch.optim.Optimizer] = []
        if muon_groups:
            self.parts.append(
                torch.optim.Muon([{**g, "use_muon": True} for g in muon_groups], **muon)
            )
        if adamw_groups:
            self.parts.append(
                torch.optim.AdamW([{**g, "use_muon": False} for g in adamw_groups], **adamw)
            )
        super().__init__([g for part in self.parts for g in part.param_groups], {})
        self._link()

    def _link(self) -> None:
        """The parts use this optimizer's group dicts and state (after a load too)."""
        for part in self.parts:
            muon = isinstance(part, torch.optim.Muon)
            part.param_groups = [g for g in self.param_groups if g["use_muon"] == muon]
            part.state = self.state

    def load_state_dict(self, state_dict) -> None:
        super().load_state_dict(state_dict)
        self._link()

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for part in self.parts:
            part.step()
        return loss


def build(cfg, model: nn.Module, params) -> MuonWithAdamW:
    """The optimizer for ``params`` (tensors, or groups of them: their options are kept)."""
    o = cfg.optimizer
    adamw_params = o.get("adamw_params")
    muon_ids = muon_parameters(model, adamw_params)
    groups = params if params and isinstance(params[0], dict) else [{"params": list(params)}]
    muon_groups, adamw_groups = [], []
    for group in groups:
        options = {k: v for k, v in group.items() if k != "params"}
        muon = [p for p in group["params"] if id(p) in muon_ids]
        rest = [p for p in group["params"] if id(p) not in muon_ids]
        muon_groups += [{"params": muon, **options}] if muon else []
        adamw_groups += [{"params": rest, **options}] if rest else []
    return MuonWithAdamW(
        muon_groups,
        adamw_groups,
        muon={
            "lr": o.lr,
            "momentum": o.momentum,
            "nesterov": o.nesterov,
            "ns_steps": o.ns_steps,
            "weight_decay": o.weight_decay,
            "adjust_lr_fn": o.get("adjust_lr_fn"),
        },
        adamw={
            "lr": o.adamw_lr,
            "betas": tuple(o.adamw_betas),
            "weight_decay": o.adamw_weight_decay,
        },
    )


def counts(optimizer: MuonWithAdamW) -> dict:
    """Tensors and elements in each part, for the summary."""
    found = {}
    for group in optimizer.param_groups:
        key = "muon" if group["use_muon"] else "adamw"
        tensors, elements = found.get(key, (0, 0))
        found[key] = (
            tensors + len(group["params"]),
            elements + sum(p.numel() for p in group["params"]),
        )
    return {
        f"{k}_{what}": v[i]
        for k, v in found.items()
        for i, what in enumerate(("tensors", "elements"))
    }


class Plugin:
    def __init__(self) -> None:
        self.optimizer: MuonWithAdamW | None = None

    @hookimpl
    def check(self, cfg, env, plan):
        found = problems(cfg, RULES)
        betas = cfg.optimizer.get("adamw_betas")
        if betas is not None and not (
            len(betas) == 2 and all(isinstance(b, int | float) and 0 <= b < 1 for b in betas)
        ):
            found.append(
                f"optimizer.adamw_betas={list(betas)} is not allowed: expected two "
                "numbers in [0, 1), e.g. [0.9, 0.95]"
            )
        if cfg.get("strategy", {}).get("name") == "fsdp":
            found.append(
                "optimizer=muon cannot run under strategy=fsdp: Newton-Schulz orthogonalises "
                "each whole weight matrix, and FSDP2/tensor parallelism give every process a "
                "shard of it; use strategy=ddp (or auto), or another optimizer"
            )
        model = plan.meta_model() if plan is not None and plan.sound else None
        if model is not None and not found and not plan.lightning:  # the split, before building
            try:
                muon_parameters(model, cfg.optimizer.get("adamw_params"))
            except TuneupError as error:
                found.append(str(error))
        if plan is not None and plan.lightning:
            found.append(
                f"optimizer=muon cannot apply to model=lightning: the LightningModule "
                f"{plan.model_name} builds its own optimizer in configure_optimizers; build "
                "torch.optim.Muon there yourself, or remove optimizer="
            )
        return found

    @hookimpl
    def configure_optimizer(self, cfg, params, trainer):
        model = getattr(trainer.lightning_module, "model", trainer.lightning_module)
        self.optimizer = build(cfg, model, params)
        return self.optimizer

    def describe(self) -> dict:
        return {
            "muon": "torch.optim.Muon: nn.Linear weights but the output layer's",
            "adamw": "torch.optim.AdamW: embeddings, output layer, norms, biases, conv filters, "
            "other parameters",
        }

    @hookimpl
    def report(self, summary):
        if self.optimizer is not None:
            summary["optimizer"] = {"implementation": "muon+adamw", **counts(self.optimizer)}
