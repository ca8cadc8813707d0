"""An exponential moving average of the weights, chosen by ``ema=off|on``: the race winners'
(airbench, timm) cheap accuracy gain, validated, checkpointed, resumed exactly and exported.

After every ``every_n_steps``-th optimizer step, ``ema = decay * ema + (1 - decay) * w`` for
every floating tensor of the module's ``state_dict``: parameters and floating buffers. One
``torch._foreach_lerp_`` does it on the device, the weight a Python float computed from host
counters, so a step never waits for the device. torch's ``AveragedModel`` with
``get_ema_multi_avg_fn`` makes the same ``_foreach_lerp_`` call, but it deep-copies the module
(a second module to move, parallelise and checkpoint beside the first; under FSDP2 a copy of
a sharded module) and tests its update counter, a device tensor, on the host at each update
(``bool(self.n_averaged == 0)``: a host-device sync on a GPU); Lightning's
``WeightAveraging`` callback refuses sharded models. Here the average is a list of tensors
beside the live ones, under FSDP2 each rank's local shards (the checkpoint holds them as
DTensors: ``tuneup.trainer.state.sharded`` writes them with DCP like the model's).

- BatchNorm: its running mean and variance are averaged with the weights (floating buffers,
  as timm's ``ModelEmaV2`` and torch's ``AveragedModel(use_buffers=True)`` do), so the
  statistics validated belong to the averaged weights' trajectory rather than to the raw
  weights; integer buffers (``num_batches_tracked``) stay the raw ones. Under DDP and FSDP
  each rank's buffers follow its own batches: at each validation the EMA buffers of rank 0
  (the checkpointed ones) are broadcast, so every rank validates the same model.
- Warm-up (``warmup=true``): TensorFlow's ``ExponentialMovingAverage(num_updates=t)`` rule,
  ``decay_t = min(decay, (1 + t) / (10 + t))``: the first updates follow the weights closely
  instead of averaging in the random initialisation for ~1 / (1 - decay) updates.
- Precision: half and bfloat16 weights (``precision=*-true``) are averaged in float32; an
  increment of (1 - decay) of a weight's change is below bfloat16's resolution.
- Validation (``validate_with=ema``): the EMA weights are copied into the model at the start
  and the trained ones back at the end (one extra copy of the weights, only meanwhile).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from tuneup import TuneupError, hookimpl
from tuneup.trainer.validation import BOOL, Integer, Number, OneOf, problems

#: The key of the plugin state that holds tensors keyed like the model's state_dict:
#: trainer/state/sharded.py saves and loads it with DCP under strategy=fsdp.
MODEL_SHAPED = "model_shaped"

RULES = {
    "ema.decay": Number(gt=0, lt=1),
    "ema.every_n_steps": Integer(low=1),
    "ema.warmup": BOOL,
    "ema.validate_with": OneOf(("ema", "raw")),
}
KEYS = ("plugin", "name", "decay", "every_n_steps", "warmup", "validate_with")
LOW_PRECISION = (torch.float16, torch.bfloat16)


def decay_at(decay: float, updates: int, warmup: bool) -> float:
    """The decay of update number ``updates`` (0 for the first): TensorFlow's warm-up rule."""
    return min(decay, (1 + updates) / (10 + updates)) if warmup else decay


def local(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's shard on this rank (the same storage), else the tensor itself."""
    from torch.distributed.tensor import DTensor

    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


class WeightAverage:
    """The EMA of ``module``'s floating state_dict tensors, updated in place, swappable in."""

    def __init__(self, module: torch.nn.Module) -> None:
        from torch.distributed.tensor import DTensor

        self.names: dict[str, int] = {}  # state_dict key -> index (tied weights share one)
        live, seen = [], {}
        with torch.no_grad():
            for name, tensor in module.state_dict(keep_vars=True).items():
                if not torch.is_floating_point(tensor):
                    continue
                key = id(tensor)
                if key not in seen:
                    seen[key] = len(live)
                    live.append(tensor)
                self.names[name] = seen[key]
            self.averaged = [t.detach().clone().to(_ema_dtype(t.dtype)) for t in live]
            self.live = [local(t).detach() for t in live]
            self.ema = [local(t) for t in self.averaged]
        params = {id(p) for p in module.parameters()}
        self.buffers = [
            e
            for t, e in zip(live, self.ema, strict=True)
            if id(t) not in params and not isinstance(t, DTensor)
        ]
        cast = [e.dtype != t.dtype for t, e in zip(self.live, self.ema, strict=True)]
        self.same = (
            [e for e, c in zip(self.ema, cast, strict=True) if not c],
            [t for t, c in zip(self.live, cast, strict=True) if not c],
        )
        self.cast = (
            [e for e, c in zip(self.ema, cast, strict=True) if c],
            [t for t, c in zip(self.live, cast, strict=True) if c],
        )
        self.backup: list[torch.Tensor] | None = None
        self.fsdp = fsdp_modules(module)

    @torch.no_grad()
    def update(self, decay: float) -> None:
        """``ema += (1 - decay) * (w - ema)``: one foreach launch (two with half weights)."""
        if self.same[0]:
            torch._foreach_lerp_(self.same[0], self.same[1], 1.0 - decay)
        if self.cast[0]:
            torch._foreach_lerp_(self.cast[0], [t.float() for t in self.cast[1]], 1.0 - decay)

    @torch.no_grad()
    def swap_in(self) -> None:
        """Copy the EMA into the model, keeping the trained weights aside."""
        self.sync_buffers()
        self.backup = [t.clone() for t in self.live]
        torch._foreach_copy_(self.live, self.ema)
        reshard(self.fsdp)

    @torch.no_grad()
    def swap_out(self) -> None:
        """Put the trained weights back (after :meth:`swap_in`; else nothing)."""
        if self.backup is not None:
            torch._foreach_copy_(self.live, self.backup)
            self.backup = None
            reshard(self.fsdp)

    @torch.no_grad()
    def sync_buffers(self) -> None:
        """Rank 0's EMA buffers on every rank (BatchNorm statistics differ per rank)."""
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            for buffer in self.buffers:
                dist.broadcast(buffer, src=0)

    def state(self) -> dict[str, torch.Tensor]:
        """The EMA keyed like the module's state_dict (DTensors where the module has them)."""
        return {name: self.averaged[i] for name, i in self.names.items()}

    @torch.no_grad()
    def load(self, weights: dict[str, torch.Tensor]) -> None:
        """Copy saved EMA tensors in: this run's layout, or full tensors into local shards."""
        if set(weights) != set(self.names):
            missing = sorted(set(self.names) - set(weights))[:3]
            extra = sorted(set(weights) - set(self.names))[:3]
            raise TuneupError(
                f"the checkpoint's EMA weights do not match the model (missing {missing}, "
                f"unknown {extra}): resume it with the model it was trained with, or ema=off"
            )
        for name, i in self.names.items():
            self.ema[i].copy_(shard_like(weights[name], self.averaged[i]))


def fsdp_modules(module: torch.nn.Module) -> list:
    """The FSDP2 modules in ``module``: those that may hold gathered copies of the weights."""
    from torch.distributed.fsdp import FSDPModule

    return [m for m in module.modules() if isinstance(m, FSDPModule)]


def reshard(modules: list) -> None:
    """Free FSDP2's gathered (unsharded) weights, so the next forward gathers the shards as
    they are now: the root module keeps its gathered weights after a forward without a
    backward (a validation), which would otherwise be the previous weights."""
    for module in modules:
        module.reshard()


def _ema_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in LOW_PRECISION else dtype


def shard_like(saved: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """This rank's part of ``saved`` as ``target`` holds it: a full tensor (a single-file
    checkpoint) is cut into ``target``'s shard with no communication."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if not isinstance(target, DTensor):
        return local(saved)
    if isinstance(saved, DTensor):
        return saved.to_local()
    full = saved.to(device=target.device, dtype=target.dtype)
    return distribute_tensor(
        full, target.device_mesh, target.placements, src_data_rank=None
    ).to_local()


def settings_problems(cfg) -> list[str]:
    node = cfg.ema
    found = [
        f"ema.{key} is not an ema setting; allowed: {', '.join(KEYS[2:])}"
        for key in node
        if key not in KEYS
    ]
    found += problems(cfg, RULES)
    strategy = cfg.get("strategy") or {}
    if strategy.get("name") == "fsdp" and strategy.get("checkpoint", "sharded") == "full":
        found.append(
            "ema=on with strategy=fsdp strategy.checkpoint=full: the EMA weights are saved as "
            "shards only; use strategy.checkpoint=sharded (tuneup-consolidate --ema writes the "
            "full EMA weights from it)"
        )
    mode = cfg.get("mode")
    if mode in ("validate", "test", "predict"):
        found.append(
            f"ema=on with mode={mode}: mode={mode} uses a checkpoint's trained weights "
            "only (its EMA is not read); leave out ema=on"
        )
    return found


class Plugin:
    def __init__(self, cfg) -> None:
        node = cfg.ema
        self.decay = node.get("decay", 0.999)
        self.every = node.get("every_n_steps", 1)
        self.warmup = node.get("warmup", True)
        self.validate = node.get("validate_with", "ema") == "ema"
        self.average: WeightAverage | None = None
        self.pending: dict | None = None  # a checkpoint's EMA, read before the model is set up
        self.updates = 0
        self.step = 0  # the optimizer step of the last update

    @hookimpl
    def check(self, cfg):
        return settings_problems(cfg)

    @hookimpl
    def on_fit_start(self, module):
        self.average = WeightAverage(module)
        if self.pending is not None:  # strategy=auto|ddp: the checkpoint was read before
            self.average.load(self.pending)
            self.pending = None

    @hookimpl
    def on_train_batch_end(self, trainer):
        step = trainer.global_step
        if self.average is None or step == self.step or step % self.every:
            return  # not after an optimizer step (accumulation), or not this one
        self.average.update(decay_at(self.decay, self.updates, self.warmup))
        self.updates += 1
        self.step = step

    @hookimpl
    def on_validation_start(self):
        if self.validate and self.average is not None:
            self.average.swap_in()

    @hookimpl
    def on_validation_end(self):
        if self.average is not None:
            self.average.swap_out()

    @hookimpl
    def on_exception(self):
        if self.average is not None:
            self.average.swap_out()  # a checkpoint written after a failure holds the raw weights

    def state_dict(self) -> dict:
        weights = self.average.state() if self.average is not None else self.pending
        return {MODEL_SHAPED: weights, "updates": self.updates, "step": self.step}

    def load_state_dict(self, state: dict) -> None:
        self.updates, self.step = state["updates"], state["step"]
        if state[MODEL_SHAPED] is None:
            return
        if self.average is None:
            self.pending = state[MODEL_SHAPED]
        else:  # strategy=fsdp: read after the model was sharded
            self.average.load(state[MODEL_SHAPED])

    def describe(self) -> dict:
        return {
            "decay": self.decay,
            "every_n_steps": self.every,
            "warmup": "min(decay, (1 + t) / (10 + t))" if self.warmup else "none",
            "validate_with": "ema" if self.validate else "raw",
            "update": "torch._foreach_lerp_ (floating parameters and buffers)",
        }

    @hookimpl
    def report(self, summary):
        summary["ema"] = {
            "updates": self.updates,
            "decay_last": decay_at(self.decay, max(self.updates - 1, 0), self.warmup),
        }
