"""Image data: built-in synthetic images, and an image folder on disk.

``synthetic_images``: every class has a fixed smooth random pattern; a sample
is its class pattern times ``signal`` plus Gaussian noise, so a model can learn
the classes (it is not pure noise) while accuracy is not trivially 100%. The
tensors are generated once, from ``data.seed``, so every run sees the same data.

``imagefolder``: ``root/train/<class>/*.jpg`` and ``root/val/<class>/*.jpg``
(torchvision's ImageFolder layout, as ImageNet is usually unpacked); JPEG,
PNG, BMP or WebP, decoded with Pillow in the DataLoader workers and
augmented as in :mod:`trainer.data.transforms`. Class indices are the sorted
class folder names of ``train/``.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from omegaconf import OmegaConf
from PIL import Image
from torch.nn import functional as F
from torch.utils.data import Dataset, TensorDataset

from tuneup import TuneupError
from tuneup.trainer.datamodule import DataModule
from tuneup.trainer.validation import Integer, Number, problems
from tuneup.zoo.data.transforms import EvalTransform, TrainTransform

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp")


class SyntheticImages(DataModule):
    rules = {
        "data.batch_size": Integer(low=1),
        "data.num_classes": Integer(low=2),
        "data.image_size": Integer(low=1),
        "data.channels": Integer(low=1),
        "data.train_samples": Integer(low=1),
        "data.val_samples": Integer(low=1),
        "data.signal": Number(ge=0),
        "data.seed": Integer(low=0),
    }

    def __init__(self, settings, configure_loader=None) -> None:
        super().__init__(settings, configure_loader)
        self.input_shape = (settings.channels, settings.image_size, settings.image_size)
        self.num_classes = settings.num_classes

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        s = self.settings
        generator = torch.Generator().manual_seed(s.seed)
        patterns = torch.randn(s.num_classes, s.channels, 4, 4, generator=generator)
        patterns = F.interpolate(patterns, size=(s.image_size, s.image_size), mode="bilinear")
        self.train_set = _sample(patterns, s.train_samples, s.signal, generator)
        self.val_set = _sample(patterns, s.val_samples, s.signal, generator)


def _sample(patterns, count: int, signal: float, generator) -> TensorDataset:
    labels = torch.randint(len(patterns), (count,), generator=generator)
    noise = torch.randn(count, *patterns.shape[1:], generator=generator)
    return TensorDataset(signal * patterns[labels] + noise, labels)


class ImageFiles(Dataset):
    """``(transform(image), label)`` for a list of ``(path, label)``; images decoded as RGB."""

    def __init__(self, samples: list[tuple[str, int]], transform) -> None:
        self.samples, self.transform = samples, transform

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int):
        path, label = self.samples[index]
        with Image.open(path) as img:
            return self.transform(img.convert("RGB")), label


def class_folders(split: Path) -> list[str]:
    """Sorted names of the sub-folders of ``split``: the classes."""
    return sorted(e.name for e in os.scandir(split) if e.is_dir())


def image_files(folder: Path):
    """Image files under ``folder`` (recursively), sorted, by extension (any case)."""
    for parent, dirs, files in os.walk(folder, followlinks=True):
        dirs.sort()
        for name in sorted(files):
            if name.lower().endswith(IMAGE_EXTENSIONS):
                yield os.path.join(parent, name)


def find_samples(split: Path, classes: list[str]) -> list[tuple[str, int]]:
    """Every ``(path, class index)`` under ``split``; a class folder unknown to ``classes`` fails."""
    index = {name: i for i, name in enumerate(classes)}
    samples = []
    for name in class_folders(split):
        if name not in index:
            raise TuneupError(
                f"{split / name} is a class folder that train/ does not have; the classes are "
                f"the folders of train/ ({len(classes)}: {', '.join(classes[:5])}...)"
            )
        samples += [(path, index[name]) for path in image_files(split / name)]
    return samples


class ImageFolder(DataModule):
    rules = {
        "data.batch_size": Integer(low=1),
        "data.image_size": Integer(low=8),
        "data.train_samples": Integer(low=1, also=(None,), note="None: all"),
        "data.val_samples": Integer(low=1, also=(None,), note="None: all"),
        "data.min_scale": Number(gt=0, le=1),
        "data.val_crop_fraction": Number(gt=0, le=1),
        "data.seed": Integer(low=0),
    }

    def __init__(self, settings, configure_loader=None) -> None:
        super().__init__(settings, configure_loader)
        self.root = Path(settings.root).expanduser()
        self.classes = class_folders(self.root / "train")
        self.input_shape = (3, settings.image_size, settings.image_size)
        self.num_classes = len(self.classes)

    @classmethod
    def problems(cls, cfg) -> list[str]:
        found = problems(cfg, cls.rules)
        root = OmegaConf.select(cfg, "data.root", throw_on_missing=False)
        if not root:
            return [*found, "data.root is not set: give the folder holding train/ and val/, "
                    "e.g. data.root=/data/imagenet"]  # fmt: skip
        root = Path(str(root)).expanduser()
        for split in ("train", "val"):
            folder = root / split
            if not folder.is_dir():
                found.append(
                    f"data.root={str(root)!r}: {folder} does not exist; expected {split}/ with "
                    f"one folder of images per class ({', '.join(IMAGE_EXTENSIONS)})"
                )
            elif next(image_files(folder), None) is None:
                found.append(
                    f"data.root={str(root)!r}: {folder} is empty: no class folder in it holds "
                    f"an image file ({', '.join(IMAGE_EXTENSIONS)})"
                )
        return found

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        s = self.settings
        train = _subset(find_samples(self.root / "train", self.classes), s.train_samples, s.seed)
        val = _subset(find_samples(self.root / "val", self.classes), s.val_samples, s.seed)
        if len(train) < s.batch_size:
            raise TuneupError(
                f"data.root={str(self.root)!r} has {len(train)} training images, fewer than "
                f"data.batch_size={s.batch_size}: no full batch; lower the batch size"
            )
        mean, std = tuple(s.mean), tuple(s.std)
        scale = (s.min_scale, 1.0)
        self.train_set = ImageFiles(train, TrainTransform(s.image_size, scale, mean=mean, std=std))
        self.val_set = ImageFiles(
            val, EvalTransform(s.image_size, s.val_crop_fraction, mean=mean, std=std)
        )


def _subset(samples: list, count: int | None, seed: int) -> list:
    """At most ``count`` samples, a fixed random choice (all classes, not the first ones)."""
    if count is None or count >= len(samples):
        return samples
    order = torch.randperm(len(samples), generator=torch.Generator().manual_seed(seed))
    return [samples[i] for i in sorted(order[:count].tolist())]
