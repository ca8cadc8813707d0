"""Small models that train in seconds on two CPU cores.

``small_resnet`` is the default: a ResNet for 32x32 images (a 3x3 stem, stages
of torchvision-style BasicBlocks, global pooling). ``mlp`` flattens the same
images; it has no batch-dependent layers, so gradient accumulation reproduces
the large-batch gradients exactly (BatchNorm, in contrast, normalises over each
micro-batch, so micro-batches differ).
"""

from __future__ import annotations

from torch import nn

from tuneup.zoo.models.resnet import BasicBlock


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
