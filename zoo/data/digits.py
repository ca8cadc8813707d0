"""``data=digits``: real handwritten digits that ship inside scikit-learn, nothing downloaded.

scikit-learn's bundled copy of the UCI optical digits test set (``sklearn.datasets.load_digits``):
1,797 images of 8x8 pixels, 16 grey levels, classes 0-9, written by 43 people. Real data
that no one here made, so a target accuracy on it says something about a recipe, where
synthetic data only says the model can fit what was planted.

The pixels (0-16) become uint8 (0-255), are upscaled once to ``data.image_size`` (bilinear,
so ``model=small_resnet`` and the ResNets get the 32x32 or larger input they are built
for) and repeated over ``data.channels`` (1 or 3). A fixed random share ``val_fraction``
(by ``data.seed``) validates, the rest trains. The batches then take the zoo's image path
(:class:`~tuneup.zoo.data.images.ImageData`): uint8 from the loader, normalised on the
training device by the training split's own mean and std.
"""

from __future__ import annotations

import importlib.util
import math

import torch
from torch.nn import functional as F

from tuneup.trainer.validation import Integer, Number, OneOf, problems
from tuneup.zoo.data.images import ImageData, Images
from tuneup.zoo.data.transforms import normalize

#: load_digits' pixel values go from 0 to this.
GREY_LEVELS = 16
SAMPLES, CLASSES = 1797, 10


def digit_pixels(image_size: int, channels: int) -> tuple[torch.Tensor, torch.Tensor]:
    """All 1,797 digits as ``[N, channels, image_size, image_size]`` uint8, and their labels."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    values = torch.as_tensor(digits.images, dtype=torch.float32)[:, None] * (255 / GREY_LEVELS)
    if image_size != values.shape[-1]:
        values = F.interpolate(
            values, size=(image_size, image_size), mode="bilinear", align_corners=False
        )
    pixels = values.round_().clamp_(0, 255).to(torch.uint8).expand(-1, channels, -1, -1)
    return pixels.contiguous(), torch.as_tensor(digits.target, dtype=torch.long)


def split(count: int, val_fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Training and validation indices: a fixed random ``val_fraction`` (by ``seed``) validates."""
    train, val, _ = held_out(count, val_fraction, seed)
    return train, val


def held_out(count: int, val_fraction: float, seed: int, test_fraction: float = 0.0):
    """Training, validation and test indices: a fixed random ``val_fraction`` (by ``seed``)
    validates, the next ``test_fraction`` of the same order tests, the rest trains (so the
    validation digits are the same with or without a test split)."""
    order = torch.randperm(count, generator=torch.Generator().manual_seed(seed))
    val = math.ceil(count * val_fraction)
    test = val + math.ceil(count * test_fraction)
    return order[test:].sort().values, order[:val].sort().values, order[val:test].sort().values


def train_count(val_fraction: float, test_fraction: float = 0.0) -> int:
    return SAMPLES - math.ceil(SAMPLES * val_fraction) - math.ceil(SAMPLES * test_fraction)


class Digits(ImageData):
    rules = {
        "data.batch_size": Integer(low=1),
        "data.image_size": Integer(low=8),
        "data.channels": OneOf((1, 3)),
        "data.val_fraction": Number(gt=0, lt=1),
        "data.test_fraction": Number(ge=0, lt=1),
        "data.seed": Integer(low=0),
        "data.preprocess": OneOf(("device", "worker")),
    }

    def __init__(self, settings, configure_loader=None) -> None:
        super().__init__(settings, configure_loader)
        self.input_shape = (settings.channels, settings.image_size, settings.image_size)
        self.num_classes = CLASSES
        self.worker_steps = [] if self.device_work else ["to_float", "normalize"]
        self.device_steps = ["to_float", "normalize"] if self.device_work else []

    @classmethod
    def problems(cls, cfg) -> list[str]:
        if importlib.util.find_spec("sklearn") is None:
            return [
                "data=digits reads the digits bundled with scikit-learn, which is not "
                "installed: pip install 'tuneup[digits]' (or scikit-learn)"
            ]
        found = problems(cfg, cls.rules)
        if found:
            return found
        train = train_count(cfg.data.val_fraction, cfg.data.get("test_fraction", 0.0))
        batch = cfg.data.batch_size
        if batch > train:
            found.append(
                f"data.batch_size={batch} is larger than the {train} training digits "
                f"(data.val_fraction={cfg.data.val_fraction}): no full batch; lower "
                "the batch size"
            )
        return found

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        s = self.settings
        pixels, labels = digit_pixels(s.image_size, s.channels)
        train, val, test = held_out(
            len(labels), s.val_fraction, s.seed, s.get("test_fraction", 0.0)
        )
        scaled = pixels[train].float() / 255
        self.mean = tuple(scaled.mean((0, 2, 3)).tolist())
        self.std = tuple(scaled.std((0, 2, 3)).tolist())
        transform = None if self.device_work else self._normalize
        self.train_set = Images(pixels[train], labels[train], transform)
        self.val_set = Images(pixels[val], labels[val], transform)
        self.test_set = Images(pixels[test], labels[test], transform) if len(test) else None

    test_hint = (
        "give data.test_fraction=0.2 (a share of the digits held out for testing, "
        "taken from the training part: give it to the fit too)"
    )

    def test_split(self):
        self.setup("test")
        return self.test_set

    def _normalize(self, pixels: torch.Tensor) -> torch.Tensor:
        return normalize(pixels, self.mean, self.std)

    def describe(self) -> dict:
        found = super().describe()
        if self.train_set is not None:
            found["samples"] = {"train": len(self.train_set), "val": len(self.val_set)}
        return found
