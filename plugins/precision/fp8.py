"""precision=fp8: torchao's float8 training of a model's ``nn.Linear`` layers.

The model's ``nn.Linear`` layers run their matmuls in float8 through torchao
(``convert_to_float8_training``, recipe ``tensorwise`` or ``rowwise``), everything else in
bf16, fp32 weights. Which layers are converted, and why each of the others is kept in
bf16, is decided by :func:`fp8_layers`; :func:`fp8_problems` says what keeps fp8 from
running (fast) on this machine. Under ``strategy=fsdp`` FSDP2 all-gathers the converted
layers' weights in float8 (torchao's ``enable_fsdp_float8_all_gather``): half the bytes
of a bf16 all-gather. The precision plugin (``plugins/precision/__init__.py``) calls these.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import logging
from dataclasses import dataclass

from omegaconf import OmegaConf
from packaging.version import Version
from torch import nn

from tuneup.trainer.environment import Environment
from tuneup.trainer.validation import BOOL, OneOf, problem, problems

#: torchao's float8 training recipes (``Float8LinearConfig.from_recipe_name``).
FP8_RECIPES = ("tensorwise", "rowwise")
FP8_RULES = {
    "precision.recipe": OneOf(FP8_RECIPES),
    "precision.skip_first_last": BOOL,
    "precision.require_compile": BOOL,
    "precision.emulate": BOOL,
}
#: float8 tensor cores: Ada (8.9: L4, L40) and Hopper (9.0: H100, H200) and newer.
FP8_CAPABILITY = (8, 9)
#: The oldest torchao whose float8 training has the recipes by name (the ``fp8`` extra).
TORCHAO_MIN = "0.10"


@dataclass(frozen=True)
class Fp8Layers:
    """Which ``nn.Linear`` layers fp8 converts, and why each of the others stays in bf16."""

    converted: tuple[str, ...]
    skipped: dict[str, str]


def linear_layers(model: nn.Module) -> list[tuple[str, nn.Linear]]:
    """The model's plain ``nn.Linear`` layers (not converted ones), in registration order."""
    return [(n, m) for n, m in model.named_modules() if type(m) is nn.Linear]


def fp8_layers(model: nn.Module, skip_first_last=True, skip=(), edges=None) -> Fp8Layers:
    """Sort the model's ``nn.Linear`` layers into converted and kept, with the reason.

    Kept in bf16: the first and last layer (``skip_first_last``: the input projection and
    the output head are where float8's 3-bit mantissa costs the most accuracy, as in
    Transformer Engine's and torchtitan's recipes), layers whose name contains one of
    ``skip``, and layers with sizes that are not multiples of 16 (what float8 tensor-core
    matmuls, ``torch._scaled_mm``, accept). ``edges`` names the first and last layer of the
    model as configured (a kernel swap may have replaced its output head since).
    """
    linears = linear_layers(model)
    if edges is None:
        edges = (linears[0][0], linears[-1][0]) if linears else ()
    converted, skipped = [], {}
    for name, layer in linears:
        if skip_first_last and name in edges:
            where = "only" if edges[0] == edges[-1] else "first" if name == edges[0] else "last"
            skipped[name] = f"{where} linear layer (precision.skip_first_last)"
        elif any(part in name for part in skip):
            skipped[name] = "named in precision.skip"
        elif layer.in_features % 16 or layer.out_features % 16:
            skipped[name] = (
                f"{layer.in_features} -> {layer.out_features} features: float8 "
                "matmuls need multiples of 16"
            )
        else:
            converted.append(name)
    return Fp8Layers(tuple(converted), skipped)


def torchao_float8():
    """``torchao.float8``, imported quietly: torchao logs a warning for each of its compiled
    extensions that cannot load (all of them with a CPU build of torch), and torch one about
    its enums; float8 training uses neither (its matmul is ``torch._scaled_mm``)."""
    loggers = [logging.getLogger(name) for name in ("torchao", "torch.utils._pytree")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        import torchao.float8 as float8
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)
    return float8


def fp8_config(recipe: str, emulate: bool = False, sharded: bool = False):
    """torchao's ``Float8LinearConfig`` for ``recipe``; ``emulate``: the float8 casts are kept
    but the matmuls run in fp32 (any device: tests and debugging, never faster); ``sharded``
    (strategy=fsdp): FSDP2 all-gathers the weights already cast to float8, where the recipe
    allows it (``tensorwise``: one scale per tensor, which the shards agree on)."""
    config = torchao_float8().Float8LinearConfig.from_recipe_name(recipe)
    if emulate:
        config = dataclasses.replace(config, emulate=True)
    if sharded and recipe == "tensorwise":
        config = dataclasses.replace(config, enable_fsdp_float8_all_gather=True)
    return config


def convert_to_fp8(
    model: nn.Module, layers: Fp8Layers, recipe: str, emulate=False, sharded: bool = False
) -> nn.Module:
    """Swap the ``layers.converted`` layers of ``model`` for torchao's ``Float8Linear``, in
    place; parameter names, weights (fp32) and their tying are unchanged."""
    names = set(layers.converted)
    config = fp8_config(recipe, emulate, sharded)
    return torchao_float8().convert_to_float8_training(
        model, module_filter_fn=lambda _, name: name in names, config=config
    )


def fp8_formats(config) -> dict[str, str]:
    """The float8 types of a torchao config: inputs and weights, and output gradients."""
    from tuneup.plugins.precision.choices import _dtype_name

    return {
        "forward": _dtype_name(config.cast_config_input.target_dtype),
        "gradients": _dtype_name(config.cast_config_grad_output.target_dtype),
    }


def fp8_problems(cfg, env: Environment) -> list[str]:
    """What keeps precision=fp8 from running (fast) here: the GPU, torchao, compile."""
    from tuneup.plugins.precision.choices import _where

    settings = cfg.precision
    found = problems(cfg, FP8_RULES)
    skip = settings.get("skip", [])
    if not OmegaConf.is_list(skip) or not all(isinstance(s, str) and s for s in skip):
        found.append(problem("precision.skip", skip, "a list of layer-name parts, e.g. [lm_head]"))
    emulate = settings.get("emulate", False) is True
    if not emulate and not (env.is_cuda and (env.cuda_capability or (0, 0)) >= FP8_CAPABILITY):
        found.append(
            f"precision=fp8 needs a GPU with float8 tensor cores (compute capability >= 8.9: "
            f"L4, L40, H100, H200 and newer), and {_where(env)} has none: choose precision=amp "
            "or precision=bf16 here (precision.emulate=true runs the float8 casts with fp32 "
            "matmuls, for tests: slower, never faster)"
        )
    found += torchao_problems()
    compiled = OmegaConf.select(cfg, "compile.name", default="off") == "on"
    if not (emulate or compiled or settings.get("require_compile", True) is False):
        found.append(
            "precision=fp8 without compile=on is slower than bf16: torchao's float8 scaling "
            "(an amax reduction and a cast per operand of every matmul) runs as separate eager "
            "kernels, which torch.compile fuses into their neighbours; add compile=on (or set "
            "precision.require_compile=false to run fp8 eagerly anyway)"
        )
    return found


def torchao_problems() -> list[str]:
    try:
        version = importlib.metadata.version("torchao")
    except importlib.metadata.PackageNotFoundError:
        return [
            f"precision=fp8 runs torchao's float8 training, and torchao is not installed: "
            f"pip install 'tuneup[fp8]' (torchao>={TORCHAO_MIN})"
        ]
    if Version(version) < Version(TORCHAO_MIN):
        return [
            f"precision=fp8 needs torchao>={TORCHAO_MIN} (its float8 recipes by name), "
            f"found {version}: pip install -U 'tuneup[fp8]'"
        ]
    return []


def no_fp8_layers(model: nn.Module, layers: Fp8Layers, model_name: str) -> str | None:
    """Why fp8 would change nothing in ``model``, or None when it converts some layer."""
    if layers.converted:
        return None
    if not layers.skipped:
        classes = sorted({type(m).__name__ for m in model.modules()})
        found = f"has no nn.Linear layer (its layers: {', '.join(classes)})"
    else:
        found = "keeps every nn.Linear in bf16: " + "; ".join(
            f"{name}: {why}" for name, why in layers.skipped.items()
        )
    return (
        f"precision=fp8 converts nn.Linear layers to float8, but model={model_name} {found}; "
        "use precision=amp, or precision.skip_first_last=false / precision.skip=[] to "
        "convert the layers kept"
    )


# --------------------------------------------------------------------------------------
# the plugin
# --------------------------------------------------------------------------------------
