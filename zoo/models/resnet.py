"""ResNet-18/34/50 with torchvision's module layout, so torchvision state dicts load strictly.

Parameter and buffer names are torchvision's (``conv1``, ``bn1``, ``layer1.0.conv1``,
``layer2.0.downsample.0``, ``fc`` ...), as are the initialisation and the
ResNet v1.5 Bottleneck (stride on the 3x3 convolution). Two knobs torchvision
does not have:

- ``stem``: ``imagenet`` is torchvision's 7x7 stride-2 convolution and 3x3
  max-pool (for 224x224 inputs); ``cifar`` is a 3x3 stride-1 convolution and
  no pooling (for 32x32 inputs, where the ImageNet stem would shrink the image
  to 8x8 before the first stage). The names are the same; only ``conv1.weight``
  changes shape ([64, 3, 3, 3] instead of [64, 3, 7, 7]), so a torchvision
  state dict loads strictly with the ImageNet stem only.
- ``width``: channels of the first stage (torchvision: 64); smaller widths
  make tests and CPU experiments fast but no longer match torchvision's shapes.
"""

from __future__ import annotations

from torch import nn

#: Blocks per stage and block type of each depth (He et al. 2016, torchvision).
DEPTHS = {
    "resnet18": ("basic", [2, 2, 2, 2]),
    "resnet34": ("basic", [3, 4, 6, 3]),
    "resnet50": ("bottleneck", [3, 4, 6, 3]),
}

#: Images at most this many pixels on a side get the CIFAR stem under ``stem: auto``.
CIFAR_STEM_MAX_SIZE = 64


def _downsample(inplanes: int, outplanes: int, stride: int) -> nn.Sequential | None:
    if stride == 1 and inplanes == outplanes:
        return None
    return nn.Sequential(
        nn.Conv2d(inplanes, outplanes, 1, stride, bias=False), nn.BatchNorm2d(outplanes)
    )


class BasicBlock(nn.Module):
    """Two 3x3 convolutions and a shortcut (ResNet-18/34, and small_resnet)."""

    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = _downsample(inplanes, planes, stride)

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (carrying the stride: v1.5), 1x1 expand by 4, and a shortcut (ResNet-50)."""

    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = _downsample(inplanes, planes * 4, stride)

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


BLOCKS = {"basic": BasicBlock, "bottleneck": Bottleneck}


class ResNet(nn.Module):
    def __init__(
        self,
        block: type[nn.Module],
        layers: list[int],
        num_classes: int = 1000,
        in_channels: int = 3,
        stem: str = "imagenet",
        width: int = 64,
    ) -> None:
        super().__init__()
        imagenet = stem == "imagenet"  # cifar: keep a small image's resolution for layer1
        self.conv1 = nn.Conv2d(
            in_channels, width, *((7, 2, 3) if imagenet else (3, 1, 1)), bias=False
        )
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1) if imagenet else nn.Identity()
        inplanes = width
        for i, count in enumerate(layers):
            planes, stride = width * 2**i, 1 if i == 0 else 2
            stage = [block(inplanes, planes, stride)]
            inplanes = planes * block.expansion
            stage += [block(inplanes, planes) for _ in range(count - 1)]
            self.add_module(f"layer{i + 1}", nn.Sequential(*stage))
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(inplanes, num_classes)
        self._init_like_torchvision()

    def _init_like_torchvision(self) -> None:
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(self.avgpool(x).flatten(1))


def stem_for(stem: str, input_shape: tuple[int, ...]) -> str:
    """``imagenet`` or ``cifar``: ``auto`` picks by the image's smaller side."""
    if stem != "auto":
        return stem
    return "cifar" if min(input_shape[1:]) <= CIFAR_STEM_MAX_SIZE else "imagenet"


def resnet(
    name: str, num_classes: int = 1000, input_shape=(3, 224, 224), stem: str = "auto", width=64
) -> ResNet:
    """``resnet18``, ``resnet34`` or ``resnet50``; torchvision's model for the defaults."""
    kind, layers = DEPTHS[name]
    return ResNet(
        BLOCKS[kind], layers, num_classes, input_shape[0], stem_for(stem, input_shape), width
    )
