"""The work: Lightning precision plugins (loss-scaler skip counting), the sharded (FSDP2)
precision, TF32 flags, and the LR scheduler held on skipped steps. What the Trainer is given and
what runs during the fit, apart from the choices (choices.py) and the checks (checks.py)."""

from __future__ import annotations

from contextlib import nullcontext

import torch
from pytorch_lightning.plugins.precision import HalfPrecision, MixedPrecision

from tuneup import TuneupError
from tuneup.plugins.precision.choices import AUTOCAST, LIGHTNING_FLAG, SCALER_KEYS, Choice


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
