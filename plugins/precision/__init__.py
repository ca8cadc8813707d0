"""Numeric precision of training: ``precision=fp32|tf32|fp16|bf16|amp|fp16-true|bf16-true|fp8``.

Each choice becomes a Lightning precision plugin *instance* given to the Trainer
(``MixedPrecision`` for autocast, ``HalfPrecision`` for the true-half modes), never
Lightning's precision strings: ``Trainer(accelerator="cpu", precision="16-mixed")``
quietly trains in bfloat16, and a run must do what was asked or say why not.

- ``fp32``: no autocast; TF32 off for CUDA matmul and cuDNN conv.
- ``tf32``: fp32 weights, no autocast, TF32 tensor-core math on for matmul and
  cuDNN conv. Without TF32 hardware (CPU, pre-Ampere GPUs) the flags have no
  effect and the summary says the run was fp32.
- ``fp16``: autocast to float16 with dynamic loss scaling (``torch.amp.GradScaler``,
  settings from config), on CPU too. Skipped steps are counted, the LR schedule
  does not advance on them, and too many in a row stop the run.
- ``bf16``: autocast to bfloat16, no scaler.
- ``amp``: bf16 where the device supports it, else fp16 with scaling; the summary
  and ``plugins.list=true`` say which and why.
- ``fp16-true`` / ``bf16-true``: weights and compute in the half type.
- ``fp8``: the model's ``nn.Linear`` layers run their matmuls in float8 through torchao's float8
  training (``convert_to_float8_training``, recipe ``tensorwise`` or ``rowwise``), everything
  else under bf16 autocast, fp32 weights. Needs fp8 tensor cores (compute capability >= 8.9)
  and, to be faster than bf16, ``compile=on``; the summary lists the layers converted and those
  kept in bf16 with the reason (first/last layer, sizes not multiples of 16, ``precision.skip``).

fp8 is a module swap, so this plugin also has a ``configure_model`` hook, unflagged: after the
kernel swaps (``tryfirst``: a fused output head is no longer an ``nn.Linear`` when fp8 looks)
and before compile (``trylast``: compile traces the float8 layers). Between the two it commutes
with activation checkpointing and memory_format: it replaces ``nn.Linear`` children in place,
keeps parameter names (``Float8Linear`` holds the same ``weight`` and ``bias``), and neither
of the others changes a Linear or its 2-D weight.

fp32 and tf32 set the flags when the fit starts and put back the previous
values when it ends or fails. The scaler's state rides in the Lightning
checkpoint (under the precision plugin's class name) and returns on resume.
"""

from __future__ import annotations

import logging
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from omegaconf import OmegaConf
from pytorch_lightning.plugins.precision import HalfPrecision, MixedPrecision
from torch import nn

from tuneup import TuneupError, hookimpl
from tuneup.plugins.precision.fp8 import (
    Fp8Layers,
    convert_to_fp8,
    fp8_config,
    fp8_formats,
    fp8_layers,
    fp8_problems,
    linear_layers,
    no_fp8_layers,
)
from tuneup.trainer.environment import BF16_CPU_FLAGS, Environment
from tuneup.trainer.validation import Integer, Number, OneOf, problems

log = logging.getLogger(__name__)

CHOICES = ("fp32", "tf32", "fp16", "bf16", "amp", "fp16-true", "bf16-true", "fp8")
HALF = {"fp16": torch.float16, "bf16": torch.bfloat16}
#: The autocast type of each mixed mode: fp8 runs what is not a converted matmul in bf16.
AUTOCAST = {**HALF, "fp8": torch.bfloat16}
#: Lightning's name for each mode that needs a Lightning precision plugin.
LIGHTNING_FLAG = {
    "fp16": "16-mixed",
    "bf16": "bf16-mixed",
    "fp16-true": "16-true",
    "bf16-true": "bf16-true",
    "fp8": "bf16-mixed",
}
SCALER_KEYS = ("init_scale", "growth_factor", "backoff_factor", "growth_interval")

RULES = {
    "precision.name": OneOf(CHOICES),
    "precision.init_scale": Number(gt=0),
    "precision.growth_factor": Number(gt=1),
    "precision.backoff_factor": Number(gt=0, lt=1),
    "precision.growth_interval": Integer(low=1),
    "precision.max_consecutive_skips": Integer(low=1),
}
#: Config keys holding sizes that tensor cores want in multiples of 8 (those it can see).
TENSOR_CORE_KEYS = (
    "data.batch_size",
    "model.width",
    "model.hidden",
    "model.hidden_size",
    "model.d_model",
    "model.n_embd",
    "model.embed_dim",
    "model.vocab_size",
    "data.vocab_size",
)


# --------------------------------------------------------------------------------------
# what a choice means on this device
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Choice:
    """A ``precision=`` choice resolved for the run's device."""

    name: str  # as configured
    ran_as: str  # what runs: differs from name for amp, and for tf32 without TF32 hardware
    why: str = ""  # the reason, whenever ran_as is not name

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        return AUTOCAST.get(self.ran_as)

    @property
    def weights_dtype(self) -> torch.dtype:
        return HALF[self.ran_as.removesuffix("-true")] if self.true_half else torch.float32

    @property
    def true_half(self) -> bool:
        return self.ran_as.endswith("-true")

    @property
    def scaled(self) -> bool:
        return self.ran_as == "fp16"

    @property
    def tf32(self) -> bool | None:
        """The TF32 flags this choice sets (None: leaves them as they are)."""
        return {"tf32": True, "fp32": False}.get(self.name)


def resolve(name: str, env: Environment) -> Choice:
    """What ``precision=name`` runs as on ``env``; amp's pick and tf32's fallback say why."""
    if name == "amp":
        if env.bf16_supported and (env.is_cuda or env.bf16_native):
            return Choice(name, "bf16", _bf16_reason(env))
        if not env.is_cuda:  # emulated half types are slower than fp32 on a CPU
            return Choice(name, "fp32", f"{env.accelerator} without bfloat16 hardware (no "
                          f"{', '.join(BF16_CPU_FLAGS)}): half precision would be emulated, "
                          "slower than fp32; ran as fp32")  # fmt: skip
        return Choice(name, "fp16", f"no bfloat16 on {_where(env)}: float16 with loss scaling")
    if name == "tf32" and not tf32_available(env):
        return Choice(name, "fp32", f"tf32 not available on {_where(env)}: ran as fp32")
    return Choice(name, name)


def tf32_available(env: Environment) -> bool:
    return env.is_cuda and env.cuda_capability is not None and env.cuda_capability >= (8, 0)


def _bf16_reason(env: Environment) -> str:
    if env.is_cuda:
        return f"{_where(env)} supports bfloat16"
    return f"{env.accelerator} autocast supports bfloat16, in hardware here ({env.bf16_native})"


def _where(env: Environment) -> str:
    if env.is_cuda and env.cuda_capability is not None:
        major, minor = env.cuda_capability
        return f"{env.device_name} (compute capability {major}.{minor})"
    return env.accelerator


# --------------------------------------------------------------------------------------
# the work: Lightning precision plugins, TF32 flags, the scheduler on skipped steps
# --------------------------------------------------------------------------------------


class SkipCounting:
    """Mixin for a Lightning precision plugin with a loss scaler: counts skipped steps.

    ``GradScaler`` skips ``optimizer.step()`` when a gradient is inf/NaN and then
    multiplies the scale by ``backoff_factor`` (< 1), so a lower scale after the
    step means the step was skipped. Reading the scale waits for the device, but
    ``GradScaler.step`` has just done so to read its found-inf flag.
    """

    def __init__(self, *args, max_consecutive_skips: int = 20, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.max_consecutive_skips = max_consecutive_skips
        self.skipped_steps = self.consecutive_skips = 0
        self.last_step_skipped = False

    def optimizer_step(self, optimizer, model, closure, **kwargs):
        if self.scaler is None:
            return super().optimizer_step(optimizer, model=model, closure=closure, **kwargs)
        before = self.scaler.get_scale()
        output = super().optimizer_step(optimizer, model=model, closure=closure, **kwargs)
        scale = self.scaler.get_scale()
        self.last_step_skipped = scale < before
        self.skipped_steps += self.last_step_skipped
        self.consecutive_skips = self.consecutive_skips + 1 if self.last_step_skipped else 0
        if self.consecutive_skips >= self.max_consecutive_skips:
            raise TuneupError(
                f"precision: {self.consecutive_skips} optimizer steps in a row were skipped for "
                f"inf/NaN gradients (the last at global step {model.trainer.global_step}, loss "
                f"scale now {scale:g}): the loss or gradients are not finite even at a small "
                "scale. Lower the learning rate, check the data, try precision=bf16, or raise "
                "precision.max_consecutive_skips."
            )
        return output


class CountingMixedPrecision(SkipCounting, MixedPrecision):
    """Lightning's autocast plugin, counting the steps its GradScaler skips."""


class ScaledPrecision(SkipCounting, MixedPrecision):
    """fp16 under FSDP2: the loss scaler without autocast. FSDP2's ``MixedPrecisionPolicy``
    casts the parameters to fp16 for compute (:func:`sharded_precision`), so autocast would
    only cast again; the scaler (:class:`ShardedGradScaler`: it agrees on inf/NaN across
    the processes, each of which sees only its shard of the gradients) still guards the
    fp16 gradients."""

    def forward_context(self):
        return nullcontext()


def make_scaler(settings, device: str, sharded: bool = False) -> torch.amp.GradScaler:
    """A GradScaler for ``device`` with the scaler settings of the ``precision`` config node."""
    kwargs = {key: settings[key] for key in SCALER_KEYS}
    if sharded:
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        return ShardedGradScaler(device=device, **kwargs)
    return torch.amp.GradScaler(device, **kwargs)


def lightning_precision(choice: Choice, settings, device: str):
    """The Lightning precision plugin instance for ``choice``; None for fp32/tf32 (the default).

    ``device`` is the autocast device ("cpu", "cuda").
    """
    if choice.ran_as in ("fp32", "tf32"):
        return None
    flag = LIGHTNING_FLAG[choice.ran_as]
    scaler = make_scaler(settings, device) if choice.scaled else None
    skips = settings.get("max_consecutive_skips", 20)
    if choice.true_half:
        return HalfPrecision(flag)
    if scaler is None:
        return MixedPrecision(flag, device)
    return CountingMixedPrecision(flag, device, scaler, max_consecutive_skips=skips)


def sharded_precision(choice: Choice, settings, device: str, parallel):
    """Under ``strategy=fsdp``: mixed precision through FSDP2's ``MixedPrecisionPolicy``
    (``parallel``: the strategy's settings, given the compute dtype), and the Lightning
    plugin that remains: the sharded loss scaler for fp16, the weights' type for the true
    half modes, none for bf16 and fp8 (their bf16 is the policy's)."""
    if choice.ran_as in ("fp32", "tf32"):
        return None
    if choice.true_half:
        return HalfPrecision(LIGHTNING_FLAG[choice.ran_as])
    parallel.param_dtype = AUTOCAST[choice.ran_as]
    if not choice.scaled:
        return None
    scaler = make_scaler(settings, device, sharded=True)
    skips = settings.get("max_consecutive_skips", 20)
    return ScaledPrecision("16-mixed", device, scaler, max_consecutive_skips=skips)


def set_tf32(enabled: bool | tuple[str, bool]) -> tuple[str, bool]:
    """Switch TF32 for CUDA matmul and cuDNN conv; return the previous state, to pass back.

    Uses ``torch.set_float32_matmul_precision`` and ``torch.backends.cudnn.allow_tf32``
    (not the newer ``fp32_precision`` API: once that is set, reading ``allow_tf32``
    raises, and Lightning and user code still read it).
    """
    previous = (torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32)
    matmul, cudnn = (
        enabled if isinstance(enabled, tuple) else ("high" if enabled else "highest", enabled)
    )
    torch.set_float32_matmul_precision(matmul)
    torch.backends.cudnn.allow_tf32 = cudnn
    return previous


def hold_scheduler_on_skipped_steps(module, precision: SkipCounting) -> None:
    """Keep per-step LR schedulers still after an optimizer step the scaler skipped.

    Lightning steps the schedulers after every optimizer step, skipped or not, so
    the schedule would run ahead of the weights. It calls them through the module's
    ``lr_scheduler_step`` hook; an instance attribute of that name takes precedence,
    and :func:`release_scheduler` removes it.
    """
    step = module.lr_scheduler_step

    def lr_scheduler_step(scheduler, metric):
        per_step = any(
            c.scheduler is scheduler and c.interval == "step"
            for c in module.trainer.lr_scheduler_configs
        )
        if not (per_step and precision.last_step_skipped):
            step(scheduler, metric)

    module.lr_scheduler_step = lr_scheduler_step


def release_scheduler(module) -> None:
    module.__dict__.pop("lr_scheduler_step", None)


def tensor_core_warnings(cfg, choice: Choice) -> list[str]:
    """Sizes in the config that are not multiples of 8, where half-precision tensor cores care."""
    found = []
    for key in TENSOR_CORE_KEYS:
        value = OmegaConf.select(cfg, key, default=None)
        sizes = list(value) if OmegaConf.is_list(value) else [value]
        bad = [s for s in sizes if isinstance(s, int) and s % 8]
        if bad:
            found.append(
                f"{key}={value} has sizes that are not multiples of 8 ({', '.join(map(str, bad))}):"
                f" {choice.ran_as} matmuls and convolutions use tensor cores best with multiples"
                f" of 8, e.g. {', '.join(str(-(-s // 8) * 8) for s in bad)}"
            )
    return found


def slow_on_cpu(choice: Choice, env: Environment) -> str:
    """float16 on a CPU: no fast kernels for its matmuls and convolutions (measured on the
    default model, 2 CPU cores: about 75x the time of a float32 step)."""
    return (f"precision={choice.name} on {env.accelerator}: float16 has no fast CPU kernels, so "
            "this trains many times slower than fp32 (the default model: about 75x); faster "
            "here: precision=fp32, or precision=amp (bfloat16 where this CPU has it, else fp32)")  # fmt: skip


def device_problems(choice: Choice, env: Environment) -> list[str]:
    needs_bf16 = choice.ran_as.startswith("bf16") or choice.ran_as == "fp8"  # fp8: around it
    if needs_bf16 and not env.bf16_supported:
        return [
            f"precision={choice.name} needs bfloat16, which {_where(env)} does not support "
            "(CUDA needs compute capability >= 8.0): choose precision=fp16 or precision=amp"
        ]
    return []


def trainer_conflicts(cfg) -> list[str]:
    return [
        f"trainer.{key}={cfg.trainer[key]} conflicts with precision={cfg.precision.name}: set the "
        f"precision with precision=<{'|'.join(CHOICES)}> and remove trainer.{key}"
        for key in ("precision", "plugins")
        if cfg.trainer.get(key) is not None
    ]


def _dtype_name(dtype: torch.dtype | None) -> str | None:
    return None if dtype is None else str(dtype).removeprefix("torch.")


class Plugin:
    def __init__(self, cfg) -> None:
        self.cfg = cfg
        self.settings = cfg.precision
        self.env: Environment | None = None  # from check; worked out from cfg if not called
        self.lightning = None  # the Lightning precision plugin given to the Trainer
        self.sharded = (
            None  # strategy=fsdp's settings: its MixedPrecisionPolicy casts, not autocast
        )
        self.previous_tf32 = None
        self.fp8_edges: tuple[str, ...] | None = None  # first and last Linear, as configured
        self.fp8: Fp8Layers | None = None  # what configure_model converted

    @property
    def choice(self) -> Choice:
        return resolve(self.settings.name, self.env or Environment.from_config(self.cfg))

    @hookimpl
    def check(self, cfg, env, plan):
        self.env = env
        found = problems(cfg, RULES)
        if found:
            return found
        choice = self.choice
        found += device_problems(choice, env) + trainer_conflicts(cfg)
        if choice.ran_as == "fp8":
            found += fp8_problems(cfg, env) or self._fp8_model_problems(plan)
        if env.is_cuda and (choice.autocast_dtype or choice.true_half):
            for warning in tensor_core_warnings(cfg, choice):
                log.warning("precision: %s", warning)
        if not env.is_cuda and choice.ran_as in ("fp16", "fp16-true"):
            log.warning("precision: %s", slow_on_cpu(choice, env))
        return found

    def _fp8_model_problems(self, plan) -> list[str]:
        model = plan.meta_model() if plan is not None else None
        if model is None:
            return []  # not built on the meta device: configure_model decides on the real one
        layers = linear_layers(model)
        self.fp8_edges = (layers[0][0], layers[-1][0]) if layers else ()
        reason = no_fp8_layers(model, self._fp8_layers(model), plan.model_name)
        return [reason] if reason else []

    def _fp8_layers(self, model: nn.Module) -> Fp8Layers:
        skip_first_last = self.settings.get("skip_first_last", True)
        skip = list(self.settings.get("skip", []))
        return fp8_layers(model, skip_first_last, skip, self.fp8_edges)

    @hookimpl  # unflagged: after kernel swaps, before compile; commutes with the others (above)
    def configure_model(self, model):
        if self.choice.ran_as != "fp8":
            return None
        self.fp8 = self._fp8_layers(model)
        recipe, emulate = self.settings.recipe, self.settings.get("emulate", False)
        sharded = OmegaConf.select(self.cfg, "strategy.name") == "fsdp"  # float8 all-gathers
        return convert_to_fp8(model, self.fp8, recipe, emulate, sharded)

    @hookimpl(trylast=True)  # after a strategy plugin has put its strategy into kwargs
    def configure_trainer(self, cfg, kwargs):
        device = (self.env or Environment.from_config(cfg)).accelerator
        parallel = getattr(kwargs.get("strategy"), "settings", None)  # strategy=fsdp's
        if parallel is not None:
            self.sharded = parallel
            self.lightning = sharded_precision(self.choice, self.settings, device, parallel)
        else:
            self.lightning = lightning_precision(self.choice, self.settings, device)
        if self.lightning is not None:
            kwargs["plugins"] = [*(kwargs.get("plugins") or []), self.lightning]

    @hookimpl
    def on_fit_start(self, module):
        if self.choice.tf32 is not None:
            self.previous_tf32 = set_tf32(self.choice.tf32)
        if isinstance(self.lightning, SkipCounting):
            hold_scheduler_on_skipped_steps(module, self.lightning)

    @hookimpl
    def on_fit_end(self, module):
        self._restore(module)

    @hookimpl
    def on_exception(self, module):
        self._restore(module)

    def _restore(self, module) -> None:
        if self.previous_tf32 is not None:
            set_tf32(self.previous_tf32)
            self.previous_tf32 = None
        release_scheduler(module)

    @hookimpl
    def report(self, summary):
        choice, scaler = self.choice, getattr(self.lightning, "scaler", None)
        summary["precision"] = {
            "name": choice.name,
            "ran_as": choice.ran_as,
            **self._compute(choice),
            "weights_dtype": _dtype_name(choice.weights_dtype),
            "tf32": self._tf32_state(choice),
            "loss_scale": scaler.get_scale() if scaler is not None else None,
            "skipped_steps": getattr(self.lightning, "skipped_steps", None),
            "note": choice.why or None,
        }
        if self.fp8 is not None:
            summary["precision"]["fp8"] = self._fp8_summary()

    def _fp8_summary(self) -> dict:
        """The recipe, float8 types and every Linear layer: converted, or kept and why."""
        recipe, emulate = self.settings.recipe, self.settings.get("emulate", False)
        layers = {"converted": list(self.fp8.converted), "kept_in_bf16": dict(self.fp8.skipped)}
        return {"recipe": recipe, **fp8_formats(fp8_config(recipe)), "emulated": emulate, **layers}

    def describe(self):
        choice = self.choice
        scaler = None
        if choice.scaled:
            scaler = {key: self.settings[key] for key in (*SCALER_KEYS, "max_consecutive_skips")}
        described = {
            "name": choice.name,
            "ran_as": choice.ran_as,
            "why": choice.why or None,
            **self._compute(choice),
            "weights_dtype": _dtype_name(choice.weights_dtype),
            "tf32": self._tf32_state(choice),
            "loss_scaler": scaler,
        }
        env = self.env or Environment.from_config(self.cfg)
        if not env.is_cuda and choice.ran_as in ("fp16", "fp16-true"):  # autotune skips it
            described["effect"] = f"slower: {slow_on_cpu(choice, env)}"
        if choice.ran_as == "fp8":
            keys = ("recipe", "skip_first_last", "skip", "require_compile", "emulate")
            described["fp8"] = OmegaConf.to_container(OmegaConf.masked_copy(self.settings, keys))
            if self.fp8 is not None:
                described["fp8"] |= {"converted": len(self.fp8.converted),
                                     "kept_in_bf16": dict(self.fp8.skipped)}  # fmt: skip
        return {k: v for k, v in described.items() if v is not None}

    def _compute(self, choice: Choice) -> dict:
        """How the half type is applied: autocast, or (strategy=fsdp) FSDP2's policy."""
        if self.sharded is None:
            return {"autocast_dtype": _dtype_name(choice.autocast_dtype)}
        return {"autocast_dtype": None, "fsdp_param_dtype": _dtype_name(self.sharded.param_dtype)}

    @staticmethod
    def _tf32_state(choice: Choice) -> str:
        return {True: "on", False: "off", None: "unchanged"}[choice.tf32]

    def state_dict(self):
        # The scaler's own state is saved by Lightning, with its precision plugin.
        if isinstance(self.lightning, SkipCounting):
            return {"skipped_steps": self.lightning.skipped_steps}
        return {}

    def load_state_dict(self, state):
        if isinstance(self.lightning, SkipCounting):
            self.lightning.skipped_steps = state.get("skipped_steps", 0)
