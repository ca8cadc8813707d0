"""Models, by the name in ``conf/model/<name>.yaml``; each builder checks its own arguments.

=================  =======  ====================================================
name               input    module
=================  =======  ====================================================
small_resnet       images   :mod:`trainer.models.small` (default, 32x32, fast on CPU)
mlp                images   :mod:`trainer.models.small` (no BatchNorm)
resnet18/34/50     images   :mod:`trainer.models.resnet` (torchvision's names)
gpt                tokens   :mod:`trainer.models.gpt` (nanoGPT-style decoder)
huggingface        tokens   :mod:`trainer.models.huggingface` (pretrained, ``model.path``)
=================  =======  ====================================================

``build_model(cfg, input_shape, num_classes)`` takes the data module's
``input_shape`` (images: ``(C, H, W)``; tokens: ``(context,)``) and
``num_classes`` (tokens: the vocabulary size); ``huggingface`` takes its shapes from its own
config instead (``ModelSpec.own_config``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from torch import nn

from tuneup.trainer.validation import Integer, Number, OneOf, problems
from tuneup.zoo.models import huggingface
from tuneup.zoo.models.gpt import GPT, Block
from tuneup.zoo.models.resnet import DEPTHS, BasicBlock, Bottleneck, ResNet, resnet
from tuneup.zoo.models.small import MLP, SmallResNet


@dataclass(frozen=True)
class ModelSpec:
    build: Callable[..., nn.Module]  # build(settings, input_shape, num_classes)
    rules: dict = field(default_factory=dict)  # validation rules for keys under ``model.``
    inputs: str = "images"  # what the model reads: "images" [B, C, H, W] or "tokens" [B, T]
    #: its shapes come from its own config (a pretrained model), not from the data's: the data
    #: need not say its classes, and the two are checked against each other as a user's are
    own_config: bool = False
    #: loader(settings) -> a function filling the model's materialised, empty parameters in place
    #: (``strategy=fsdp``: each process's shards); None: they are initialised
    loader: Callable | None = None


def _small_resnet(settings, input_shape, num_classes):
    return SmallResNet(input_shape[0], num_classes, settings.width, list(settings.blocks))


def _mlp(settings, input_shape, num_classes):
    features = 1
    for size in input_shape:
        features *= size
    return MLP(features, num_classes, list(settings.hidden))


def _resnet(settings, input_shape, num_classes):
    return resnet(settings.name, num_classes, tuple(input_shape), settings.stem, settings.width)


def _gpt(settings, input_shape, num_classes):
    context = settings.get("context") or input_shape[0]
    return GPT(
        num_classes,
        context,
        settings.layers,
        settings.heads,
        settings.width,
        settings.get("dropout", 0.0),
    )


RESNET_RULES = {"model.width": Integer(low=1), "model.stem": OneOf(("auto", "imagenet", "cifar"))}
GPT_RULES = {
    "model.layers": Integer(low=1),
    "model.heads": Integer(low=1),
    "model.width": Integer(low=1),
    "model.context": Integer(low=1, also=(None,), note="None: the data's sequence length"),
    "model.dropout": Number(ge=0, lt=1),
}

MODELS: dict[str, ModelSpec] = {
    "small_resnet": ModelSpec(_small_resnet, {"model.width": Integer(low=1)}),
    "mlp": ModelSpec(_mlp),
    **{name: ModelSpec(_resnet, RESNET_RULES) for name in DEPTHS},
    "gpt": ModelSpec(_gpt, GPT_RULES, inputs="tokens"),
    "huggingface": ModelSpec(
        huggingface.build, huggingface.RULES, "tokens", own_config=True, loader=huggingface.loader
    ),
}


def check_model(cfg) -> list[str]:
    name = cfg.model.name
    if name not in MODELS:
        return [f"model.name={name!r} is not allowed: expected one of {', '.join(MODELS)}"]
    found = problems(cfg, MODELS[name].rules)
    for key in ("blocks", "hidden"):
        values = cfg.model.get(key)
        if values is not None and (isinstance(values, str) or not isinstance(values, Sequence)):
            found.append(
                f"model.{key}={values!r} is not allowed: expected a non-empty list of "
                f"integers >= 1, e.g. model.{key}=[{values}]"
            )
        elif values is not None and (
            len(values) == 0 or not all(Integer(low=1)(v) for v in values)
        ):
            found.append(
                f"model.{key}={list(values)!r} is not allowed: expected a non-empty list "
                "of integers >= 1"
            )
    if name == "gpt" and not found:
        found += _gpt_problems(cfg)
    if name == "huggingface" and not found:
        found += huggingface.problems(cfg)
    return found


def _gpt_problems(cfg) -> list[str]:
    m, found = cfg.model, []
    if m.width % m.heads:
        found.append(
            f"model.width={m.width} is not divisible by model.heads={m.heads}: each head gets "
            "width / heads channels; choose a width that is a multiple of the heads"
        )
    context, data_context = m.get("context"), cfg.data.get("context")
    if context is not None and data_context is not None and context < data_context:
        found.append(
            f"model.context={context} is shorter than the data's sequences "
            f"(data.context={data_context}): raise model.context or set it to null"
        )
    return found


def build_model(cfg, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    return MODELS[cfg.model.name].build(cfg.model, input_shape, num_classes)


__all__ = [
    "GPT",
    "MLP",
    "MODELS",
    "BasicBlock",
    "Block",
    "Bottleneck",
    "ModelSpec",
    "ResNet",
    "SmallResNet",
    "build_model",
    "check_model",
    "resnet",
]
