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

This module holds the thin ``Plugin`` only; the work is in one module per concern:
``choices`` (the choices and what each runs as on this device), ``scaling`` (the Lightning
precision plugins with skip counting, the sharded (FSDP2) precision, TF32 flags, the scheduler
held on skipped steps), ``checks`` (what ``check`` finds) and ``fp8`` (the float8 swap).
"""

from __future__ import annotations

import logging

from omegaconf import OmegaConf
from torch import nn

from tuneup import hookimpl
from tuneup.plugins.precision.checks import (
    RULES,
    device_problems,
    slow_on_cpu,
    tensor_core_warnings,
    trainer_conflicts,
)
from tuneup.plugins.precision.choices import SCALER_KEYS, Choice, _dtype_name, resolve
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
from tuneup.plugins.precision.scaling import (
    SkipCounting,
    hold_scheduler_on_skipped_steps,
    lightning_precision,
    release_scheduler,
    set_tf32,
    sharded_precision,
)
from tuneup.trainer.environment import Environment
from tuneup.trainer.validation import problems

log = logging.getLogger(__name__)


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
                described["fp8"] |= {
                    "converted": len(self.fp8.converted),
                    "kept_in_bf16": dict(self.fp8.skipped),
                }
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
