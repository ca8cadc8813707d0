"""``data=imagefolder``: ``root/train/<class>/*.jpg`` and ``root/val/<class>/*.jpg``
(torchvision's ImageFolder layout, as ImageNet is usually unpacked); JPEG, PNG, BMP or
WebP, decoded in the DataLoader workers (:mod:`tuneup.zoo.data.transforms`). Class
indices are the sorted class folder names of ``train/``.

This module holds the data module and the mean/std measurement (``data.normalize=compute``);
the files are found and read by :mod:`tuneup.zoo.data.image_files`, the settings checked
together by :mod:`tuneup.zoo.data.image_checks`, and the batches finished on the device by
:class:`~tuneup.zoo.data.images.ImageData`.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from lightning_fabric.utilities.apply_func import move_data_to_device
from omegaconf import OmegaConf

from tuneup.errors import TuneupError
from tuneup.trainer.validation import Integer, Number, OneOf, problems
from tuneup.zoo.data.decoders import DECODERS
from tuneup.zoo.data.image_checks import _jpeg_only, _setting_problems
from tuneup.zoo.data.image_files import (
    IMAGE_EXTENSIONS,
    DecodeClock,
    ImageFiles,
    _subset,
    class_folders,
    find_samples,
    image_files,
)
from tuneup.zoo.data.images import ImageData
from tuneup.zoo.data.transforms import (
    CenterCrop,
    Encoded,
    OnWorker,
    TrainCrop,
    collate_encoded,
    decode_on_device,
    device_images,
)

log = logging.getLogger(__name__)

#: Training images ``data.normalize=compute`` measures the mean and std on.
COMPUTE_SAMPLES = 256


class ImageFolder(ImageData):
    rules = {
        "data.batch_size": Integer(low=1),
        "data.image_size": Integer(low=8),
        "data.train_samples": Integer(low=1, also=(None,), note="None: all"),
        "data.val_samples": Integer(low=1, also=(None,), note="None: all"),
        "data.min_scale": Number(gt=0, le=1),
        "data.max_scale": Number(gt=0, le=1),
        "data.flip": OneOf((True, False)),
        "data.val_crop_fraction": Number(gt=0, le=1),
        "data.normalize": OneOf(("given", "compute", "none")),
        "data.preprocess": OneOf(("device", "worker")),
        "data.decoder": OneOf(DECODERS),
        "data.draft": OneOf((True, False)),
        "data.seed": Integer(low=0),
    }

    def __init__(self, settings, configure_loader=None) -> None:
        super().__init__(settings, configure_loader)
        self.root = Path(self.place(settings)).expanduser()
        self.classes = self.find_classes()
        self.input_shape = (3, settings.image_size, settings.image_size)
        self.num_classes = len(self.classes)
        self.decoder = settings.get("decoder", "pillow")
        self.clock = DecodeClock()
        self.normalized_by = settings.get("normalize", "given")
        if self.decoder == "nvjpeg":
            self.loader_options = {"collate_fn": collate_encoded}

    @classmethod
    def problems(cls, cfg) -> list[str]:
        found = problems(cfg, cls.rules) + _setting_problems(cfg.data)
        root = OmegaConf.select(cfg, "data.root", throw_on_missing=False)
        if not root:
            return [
                *found,
                "data.root is not set: give the folder holding train/ and val/, "
                "e.g. data.root=/data/imagenet",
            ]
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
        train = self.split_samples("train", s.train_samples)
        val = self.split_samples("val", s.val_samples)
        if len(train) < s.batch_size:
            raise TuneupError(
                f"{self.where} has {len(train)} training images, fewer than "
                f"data.batch_size={s.batch_size}: no full batch; lower the batch size"
            )
        if self.decoder == "nvjpeg":
            self.jpeg_only(train, val)
        self.mean, self.std = self._mean_std(train)
        train_crop, val_crop = self._crops()
        self.train_set = ImageFiles(train, self._worker_part(train_crop), self.clock)
        self.val_set = ImageFiles(val, self._worker_part(val_crop))
        self._name_steps()

    test_hint = "data=imagefolder tests on root/test/<class>/ (as root/val/): add that folder"

    def test_split(self):
        """``root/test/<class>/*`` where that folder exists (cropped as validation is)."""
        folder = self.root / "test"
        if self.test_set is None and self.settings.get("name") == "imagefolder" and folder.is_dir():
            self.setup("test")
            samples = _subset(find_samples(folder, self.classes), None, self.settings.seed)
            self.test_set = ImageFiles(samples, self._worker_part(self._crops()[1]))
        return self.test_set

    @staticmethod
    def place(settings) -> str:
        """The folder the data are in (``data.root``; ``data=shards``: ``data.path``)."""
        return settings.root

    def find_classes(self) -> list[str]:
        return class_folders(self.root / "train")

    @property
    def where(self) -> str:
        """The data's place, as the user gave it (for messages)."""
        return f"data.root={str(self.root)!r}"

    def split_samples(self, split: str, count: int | None):
        """``(path, label)`` of a split's images (at most ``count``: a fixed random choice).

        ``data=shards`` gives a sequence of ``(InMemory, label)`` read from its shards instead.
        """
        return _subset(find_samples(self.root / split, self.classes), count, self.settings.seed)

    def jpeg_only(self, train, val) -> None:
        """``data.decoder=nvjpeg`` decodes JPEG only: fail on any other image."""
        _jpeg_only(train + val)

    def _crops(self) -> tuple[TrainCrop, CenterCrop]:
        s = self.settings
        decoder = "pillow" if self.decoder == "nvjpeg" else self.decoder  # header and size only
        train = TrainCrop(
            s.image_size,
            (s.min_scale, s.get("max_scale", 1.0)),
            flip=s.flip,
            decoder=decoder,
            draft=s.draft,
        )
        val = CenterCrop(s.image_size, s.val_crop_fraction, decoder=decoder, draft=s.draft)
        return train, val

    def _worker_part(self, crop: TrainCrop):
        if self.decoder == "nvjpeg":
            return Encoded(crop)
        return crop if self.device_work else OnWorker(crop, self.mean, self.std)

    def _mean_std(self, train: list) -> tuple:
        s = self.settings
        if self.normalized_by == "none":
            return None, None
        if self.normalized_by == "given":
            return tuple(s.mean), tuple(s.std)
        subset = _subset(train, COMPUTE_SAMPLES, s.seed)
        crop = CenterCrop(s.image_size, s.val_crop_fraction, decoder="pillow", draft=s.draft)
        mean, std = measure_mean_std([path for path, _ in subset], crop)
        log.info(
            "data.normalize=compute: mean=%s std=%s, measured on %d training images; to skip "
            "the measurement: data.normalize=given 'data.mean=%s' 'data.std=%s'",
            mean,
            std,
            len(subset),
            list(mean),
            list(std),
        )
        self.normalized_by = f"computed on {len(subset)} training images"
        return mean, std

    def device_batch(self, batch, device: torch.device):
        if self.decoder != "nvjpeg":
            return super().device_batch(batch, device)
        encoded, labels, flips, boxes = batch
        pixels = decode_on_device(encoded, boxes, self.settings.image_size, device)
        flips = flips if flips.any() else None
        labels, flips = move_data_to_device([labels, flips], device)
        return [device_images(pixels, flips, self.mean, self.std), labels]

    def _name_steps(self) -> None:
        s = self.settings
        decode = f"decode ({self.decoder}{', draft' if s.draft else ''})"
        crop = f"random resized crop {s.image_size} (scale {s.min_scale}-{s.get('max_scale', 1.0)})"
        flip = ["flip coin"] if s.flip else []
        tail = ["to_float"] + ([] if self.mean is None else ["normalize"])
        if self.decoder == "nvjpeg":
            self.worker_steps = ["read bytes", "crop box", *flip]
            self.device_steps = [decode, crop, *(["flip"] if s.flip else []), *tail]
        elif self.device_work:
            self.worker_steps = [decode, crop, *flip]
            self.device_steps = [*(["flip"] if s.flip else []), *tail]
        else:
            self.worker_steps = [decode, crop, *(["flip"] if s.flip else []), *tail]
            self.device_steps = []

    def describe(self) -> dict:
        return {**super().describe(), "normalize": self.normalized_by, **self.clock.figures()}


def measure_mean_std(paths: list[str], crop: CenterCrop) -> tuple[tuple, tuple]:
    """Per-channel mean and std of the pixels (scaled to [0, 1]) of ``paths``' centre crops."""
    total = torch.zeros(3, dtype=torch.float64)
    squares = torch.zeros(3, dtype=torch.float64)
    count = 0
    for path in paths:
        pixels = crop(path)[0].double() / 255
        total += pixels.sum((1, 2))
        squares += (pixels**2).sum((1, 2))
        count += pixels[0].numel()
    mean = total / count
    std = (squares / count - mean**2).clamp_min(1e-12).sqrt()
    return tuple(round(v, 4) for v in mean.tolist()), tuple(round(v, 4) for v in std.tolist())
