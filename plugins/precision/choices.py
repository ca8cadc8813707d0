"""The ``precision=`` choices and what each runs as on the run's device (amp's pick, tf32's
fallback, and why): held apart from the Lightning plugins and the checks, which all read it."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tuneup.trainer.environment import BF16_CPU_FLAGS, Environment

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
            return Choice(
                name,
                "fp32",
                f"{env.accelerator} without bfloat16 hardware (no "
                f"{', '.join(BF16_CPU_FLAGS)}): half precision would be emulated, "
                "slower than fp32; ran as fp32",
            )
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


def _dtype_name(dtype: torch.dtype | None) -> str | None:
    return None if dtype is None else str(dtype).removeprefix("torch.")
