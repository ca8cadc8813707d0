"""What ``check`` finds before a run: bad settings, sizes tensor cores dislike, a device without
bfloat16, float16 on a CPU, and Lightning's own precision keys set beside ours."""

from __future__ import annotations

from omegaconf import OmegaConf

from tuneup.plugins.precision.choices import CHOICES, Choice, _where
from tuneup.trainer.environment import Environment
from tuneup.trainer.validation import Integer, Number, OneOf

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
    """float16 on a CPU: no fast kernels for its matmuls and convolutions, so a step takes
    many times a float32 one (docs/benchmarks.md#precision)."""
    return (
        f"precision={choice.name} on {env.accelerator}: float16 has no fast CPU kernels, so "
        "this trains many times slower than fp32 (the default model: about 75x); faster "
        "here: precision=fp32, or precision=amp (bfloat16 where this CPU has it, else fp32)"
    )


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
