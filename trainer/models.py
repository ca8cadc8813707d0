"""Models, by the name in ``conf/model/<name>.yaml``; each builder checks its own arguments.

``small_resnet`` is the default: a ResNet for 32x32 images (a 3x3 stem, three
stages of BasicBlocks, global pooling), fast enough to train on two CPU cores.
``mlp`` flattens the same images; it has no batch-dependent layers, so
gradient accumulation reproduces the large-batch gradients exactly (BatchNorm,
in contrast, normalises over each micro-batch, so micro-batches differ).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from torch import nn

from trainer.validation import Integer, problems


class BasicBlock(nn.Module):
    """The ResNet basic block (two 3x3 convs), torchvision's layout and parameter names."""

    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(
                nn.Conv2d(inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes)
            )

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class SmallResNet(nn.Module):
    def __init__(self, in_channels: int, num_classes: int, width: int, blocks: list[int]) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, width, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        layers, inplanes = [], width
        for i, count in enumerate(blocks):
            planes = width * 2**i
            stage = [BasicBlock(inplanes, planes, 1 if i == 0 else 2)]
            stage += [BasicBlock(planes, planes) for _ in range(count - 1)]
            layers.append(nn.Sequential(*stage))
            inplanes = planes
        self.layers = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(inplanes, num_classes)

    def forward(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.avgpool(self.layers(x)).flatten(1)
        return self.fc(x)


class MLP(nn.Module):
    def __init__(self, in_features: int, num_classes: int, hidden: list[int]) -> None:
        super().__init__()
        layers, width = [nn.Flatten()], in_features
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        layers.append(nn.Linear(width, num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x):
        return self.net(x)


@dataclass(frozen=True)
class ModelSpec:
    build: Callable[..., nn.Module]  # build(settings, input_shape, num_classes)
    rules: dict = field(default_factory=dict)  # validation rules for keys under ``model.``


def _small_resnet(settings, input_shape, num_classes):
    return SmallResNet(input_shape[0], num_classes, settings.width, list(settings.blocks))


def _mlp(settings, input_shape, num_classes):
    features = 1
    for size in input_shape:
        features *= size
    return MLP(features, num_classes, list(settings.hidden))


MODELS: dict[str, ModelSpec] = {
    "small_resnet": ModelSpec(_small_resnet, {"model.width": Integer(low=1)}),
    "mlp": ModelSpec(_mlp),
}


def check_model(cfg) -> list[str]:
    name = cfg.model.name
    if name not in MODELS:
        return [f"model.name={name!r} is not allowed: expected one of {', '.join(MODELS)}"]
    found = problems(cfg, MODELS[name].rules)
    for key in ("blocks", "hidden"):
        values = cfg.model.get(key)
        if values is not None and (len(values) == 0 or not all(Integer(low=1)(v) for v in values)):
            found.append(
                f"model.{key}={list(values)!r} is not allowed: expected a non-empty list "
                "of integers >= 1"
            )
    return found


def build_model(cfg, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    return MODELS[cfg.model.name].build(cfg.model, input_shape, num_classes)
