"""The standard ImageNet augmentation, written with Pillow and torch (torchvision is not required).

Training: random resized crop (area 8-100 %, aspect 3/4-4/3), horizontal flip
with probability 1/2, scale to [0, 1], normalise by the dataset mean and std.
Validation: resize the shorter side to ``size / crop_fraction`` (256 for 224),
centre crop ``size``, normalise. The crop geometry follows torchvision's
``RandomResizedCrop.get_params`` and resizing is Pillow's antialiased bilinear,
as torchvision does for Pillow images. Random numbers come from torch's RNG,
which the DataLoader seeds differently in every worker.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from PIL import Image

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def random_resized_crop_box(
    width: int, height: int, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)
) -> tuple[int, int, int, int]:
    """``(left, top, right, bottom)`` of a random crop covering ``scale`` of the area at ``ratio``.

    Ten tries, as torchvision; if none fits, a centre crop with the aspect ratio clamped.
    """
    area = width * height
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target = area * torch.empty(1).uniform_(*scale).item()
        aspect = math.exp(torch.empty(1).uniform_(*log_ratio).item())
        w = round(math.sqrt(target * aspect))
        h = round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            left = int(torch.randint(0, width - w + 1, (1,)))
            top = int(torch.randint(0, height - h + 1, (1,)))
            return left, top, left + w, top + h
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, round(width / min(ratio))
    elif in_ratio > max(ratio):
        w, h = round(height * max(ratio)), height
    else:
        w, h = width, height
    left, top = (width - w) // 2, (height - h) // 2
    return left, top, left + w, top + h


def to_normalized_tensor(img: Image.Image, mean, std) -> torch.Tensor:
    """``[C, H, W]`` float32: pixel / 255, minus ``mean``, divided by ``std`` per channel."""
    pixels = torch.from_numpy(np.array(img, dtype=np.uint8)).permute(2, 0, 1)
    mean = torch.tensor(mean).view(-1, 1, 1)
    std = torch.tensor(std).view(-1, 1, 1)
    return (pixels.float() / 255 - mean) / std


class TrainTransform:
    """Random resized crop to ``size`` x ``size``, random horizontal flip, normalise."""

    def __init__(self, size: int, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3),
                 mean=IMAGENET_MEAN, std=IMAGENET_STD) -> None:  # fmt: skip
        self.size, self.scale, self.ratio = size, tuple(scale), tuple(ratio)
        self.mean, self.std = tuple(mean), tuple(std)

    def __call__(self, img: Image.Image) -> torch.Tensor:
        box = random_resized_crop_box(*img.size, self.scale, self.ratio)
        # One resize from the box: Pillow crops and scales in a single antialiased pass.
        img = img.resize((self.size, self.size), Image.Resampling.BILINEAR, box=box)
        if torch.rand(1).item() < 0.5:
            img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        return to_normalized_tensor(img, self.mean, self.std)


class EvalTransform:
    """Resize the shorter side to ``size / crop_fraction``, centre crop ``size``, normalise."""

    def __init__(self, size: int, crop_fraction: float = 0.875,
                 mean=IMAGENET_MEAN, std=IMAGENET_STD) -> None:  # fmt: skip
        self.size, self.resize = size, round(size / crop_fraction)
        self.mean, self.std = tuple(mean), tuple(std)

    def __call__(self, img: Image.Image) -> torch.Tensor:
        width, height = img.size
        short = min(width, height)
        new = (round(width * self.resize / short), round(height * self.resize / short))
        img = img.resize(new, Image.Resampling.BILINEAR)
        left, top = (new[0] - self.size) // 2, (new[1] - self.size) // 2
        img = img.crop((left, top, left + self.size, top + self.size))
        return to_normalized_tensor(img, self.mean, self.std)
