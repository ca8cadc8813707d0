"""Large-batch optimizers, chosen by ``optimizer=lamb|lars`` (with ``optimizer.fused=true|false``).

LAMB (You et al. 2019) and LARS (You et al. 2017) scale each layer's update by a trust ratio
``||w|| / ||update||``, which keeps training stable at batch sizes where SGD/Adam diverge.
Norms and biases (parameters with ndim <= 1) are excluded from weight decay and trust ratio.
``fused=true`` updates all parameters in a few multi-tensor Triton launches (CUDA + the
``tuneup[kernels]`` extra); on CPU it is a check error, never a silent fallback.

Linear scaling: with ``optimizer.base_batch_size`` set, the learning rate is
``optimizer.lr * global_batch / base_batch_size``, the global batch being the run's effective
batch size as plugins/grad_accum/ defines it for everything else (data.batch_size x
accumulation x world size, however accumulation is set: ``grad_accum.steps`` or
``grad_accum.global_batch_size``); combine with ``scheduler.warmup_steps`` (see
``experiment=large_batch``). The summary says which implementation each step ran, and the
learning rate.
"""

from __future__ import annotations

from tuneup import TuneupError, hookimpl
from tuneup.trainer.validation import BOOL, Integer, Number, OneOf, problems

from .grad_accum import effective_batch_size
from .kernels import Lamb, Lars, triton_support

RULES = {
    "optimizer.name": OneOf(("lamb", "lars")),
    "optimizer.lr": Number(gt=0),
    "optimizer.weight_decay": Number(ge=0),
    "optimizer.fused": BOOL,
    "optimizer.exclude_norms_and_biases": BOOL,
    "optimizer.base_batch_size": Integer(low=1, also=(None,)),
    "optimizer.eps": Number(gt=0),
    "optimizer.momentum": Number(ge=0, lt=1),
    "optimizer.trust_coefficient": Number(gt=0),
    "optimizer.trust_clip": Number(gt=0, also=(None,)),
}


def scaled_lr(cfg, world_size: int, batch_size: int | None = None) -> float:
    """``optimizer.lr``, linearly scaled to the effective batch when ``base_batch_size`` is set
    (``batch_size``: the batch per process, when the data module keeps its own)."""
    base = cfg.optimizer.get("base_batch_size")
    if not base:
        return cfg.optimizer.lr
    effective = effective_batch_size(cfg, world_size, batch_size)
    if effective is None:
        raise TuneupError(
            f"optimizer.base_batch_size={base} scales the learning rate to the effective batch "
            "size, but data.batch_size is null (the data module's own, unknown here): set "
            "data.batch_size, or optimizer.base_batch_size=null"
        )
    return cfg.optimizer.lr * effective / base


def build_optimizer(cfg, params, world_size: int, batch_size: int | None = None):
    o = cfg.optimizer
    common = {
        "lr": scaled_lr(cfg, world_size, batch_size),
        "weight_decay": o.weight_decay,
        "exclude_norms_and_biases": o.get("exclude_norms_and_biases", True),
        "fused": o.fused,
    }
    if o.name == "lamb":
        return Lamb(
            params, betas=tuple(o.betas), eps=o.eps, trust_clip=o.get("trust_clip"), **common
        )
    return Lars(
        params, momentum=o.momentum, trust_coefficient=o.trust_coefficient, eps=o.eps, **common
    )


class Plugin:
    def __init__(self) -> None:
        self.optimizer = None
        self.lr = None

    @hookimpl
    def check(self, cfg, env, plan):
        found = problems(cfg, RULES)
        if plan is not None and plan.lightning:
            found.append(
                f"optimizer={cfg.optimizer.name} cannot apply to model=lightning: the "
                f"LightningModule {plan.model_name} builds its own optimizer in "
                "configure_optimizers; remove optimizer=, or build tuneup's "
                "tuneup.plugins.kernels.Lamb/Lars there yourself"
            )
        if (
            cfg.optimizer.get("fused")
            and triton_support.implementation(env.accelerator) != "triton"
        ):
            found.append(
                f"optimizer.fused=true needs CUDA and Triton (pip install 'tuneup[kernels]'), "
                f"but this run is on {env.accelerator}"
                + ("" if triton_support.triton else " without Triton")
                + "; use optimizer.fused=false"
            )
        return found

    @hookimpl
    def configure_optimizer(self, cfg, params, trainer):
        batch = getattr(trainer.datamodule, "batch_size", None)  # the data module's, if its own
        self.optimizer = build_optimizer(cfg, params, trainer.world_size, batch)
        self.lr = self.optimizer.defaults["lr"]
        return self.optimizer

    @hookimpl
    def report(self, summary):
        if self.optimizer is not None:
            summary["optimizer"] = {"implementation": self.optimizer.implementation, "lr": self.lr}
