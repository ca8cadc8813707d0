"""Large-batch optimizers, chosen by ``optimizer=lamb|lars`` (with ``optimizer.fused=true|false``).

LAMB (You et al. 2019) and LARS (You et al. 2017) scale each layer's update by a trust ratio
``||w|| / ||update||``, which keeps training stable at batch sizes where SGD/Adam diverge.
Norms and biases (parameters with ndim <= 1) are excluded from weight decay and trust ratio.
``fused=true`` updates all parameters in a few multi-tensor Triton launches (CUDA + the
``tuneup[kernels]`` extra); on CPU it is a check error, never a silent fallback.

Linear scaling: with ``optimizer.base_batch_size`` set, the learning rate is
``optimizer.lr * global_batch / base_batch_size`` (global batch = data.batch_size x
accumulation x world size); combine with ``scheduler.warmup_steps`` (see
``experiment=large_batch``). The summary says which implementation each step ran.
"""

from __future__ import annotations

from tuneup import hookimpl
from tuneup.trainer.validation import BOOL, Integer, Number, OneOf, problems

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


def global_batch_size(cfg, world_size: int) -> int:
    steps = (cfg.get("grad_accum") or {}).get("steps") or 1
    return cfg.data.batch_size * steps * world_size


def scaled_lr(cfg, world_size: int) -> float:
    """``optimizer.lr``, linearly scaled to the global batch when ``base_batch_size`` is set."""
    base = cfg.optimizer.get("base_batch_size")
    return cfg.optimizer.lr * (global_batch_size(cfg, world_size) / base if base else 1.0)


def build_optimizer(cfg, params, world_size: int):
    o = cfg.optimizer
    common = {
        "lr": scaled_lr(cfg, world_size),
        "weight_decay": o.weight_decay,
        "exclude_norms_and_biases": o.get("exclude_norms_and_biases", True),
        "fused": o.fused,
    }
    if o.name == "lamb":
        return Lamb(params, betas=tuple(o.betas), eps=o.eps, trust_clip=o.get("trust_clip"),
                    **common)  # fmt: skip
    return Lars(params, momentum=o.momentum, trust_coefficient=o.trust_coefficient, eps=o.eps,
                **common)  # fmt: skip


class Plugin:
    def __init__(self) -> None:
        self.optimizer = None
        self.lr = None

    @hookimpl
    def check(self, cfg, env, plan):
        found = problems(cfg, RULES)
        if plan is not None and plan.sound and plan.lightning:
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
        self.optimizer = build_optimizer(cfg, params, trainer.world_size)
        self.lr = self.optimizer.defaults["lr"]
        return self.optimizer

    @hookimpl
    def report(self, summary):
        if self.optimizer is not None:
            summary["optimizer"] = {"implementation": self.optimizer.implementation, "lr": self.lr}
