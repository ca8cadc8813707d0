"""Image data: built-in synthetic images, and an image folder on disk.

Both hand the model ``[B, C, H, W]`` float batches, normalised per channel, and both,
by default (``data.preprocess=device``), send them from the DataLoader as **uint8**:
the workers do the per-image work (decode, crop, resize), and the data module's
:meth:`ImageData.device_batch` does the per-batch rest on the training device after
the copy (flip, to float, normalise; :func:`~tuneup.zoo.data.transforms.device_images`).
A batch then crosses PCIe at a quarter of float32's bytes and the GPU, not a worker,
does the arithmetic. ``data.preprocess=worker`` does it all in the workers (float32
batches), the path this replaced, kept as the reference: for the same seed the model
sees the same batches either way, within float rounding (tests/test_data_path.py).

``synthetic_images``: every class has a fixed smooth random pattern; a sample is its
class pattern times ``signal`` plus Gaussian noise, stored as uint8 pixels
``127.5 + 31.875 * value`` (normalised back with mean 0.5, std 0.125: values beyond 4
standard deviations clip). Generated once from ``data.seed``, so every run sees the same
data. ``data.on_device=true`` generates them into the training device's memory and cuts
batches there: no worker, no copy, the model alone (NVIDIA's "synthetic" backend).

``imagefolder``: ``root/train/<class>/*.jpg`` and ``root/val/<class>/*.jpg``
(torchvision's ImageFolder layout, as ImageNet is usually unpacked); JPEG, PNG, BMP or
WebP, decoded in the DataLoader workers (:mod:`tuneup.zoo.data.transforms`). Class
indices are the sorted class folder names of ``train/``.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import time
from pathlib import Path

import torch
from lightning_fabric.utilities.apply_func import move_data_to_device
from omegaconf import OmegaConf
from torch.nn import functional as F
from torch.utils.data import Dataset, get_worker_info

from tuneup import TuneupError
from tuneup.trainer.datamodule import DataModule
from tuneup.trainer.validation import Integer, Number, OneOf, problems
from tuneup.zoo.data.transforms import (
    DECODERS,
    JPEG_SUFFIXES,
    CenterCrop,
    Encoded,
    OnWorker,
    TrainCrop,
    collate_encoded,
    decode_on_device,
    device_images,
    normalize,
)

log = logging.getLogger(__name__)

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp")
#: Training images ``data.normalize=compute`` measures the mean and std on.
COMPUTE_SAMPLES = 256
#: synthetic_images: pixel = 127.5 + 31.875 * value, so value = (pixel / 255 - 0.5) / 0.125.
SYNTHETIC_MEAN, SYNTHETIC_STD = 0.5, 0.125


class ImageData(DataModule):
    """What the zoo's image data sets share: where the work happens, and the device's part."""

    def __init__(self, settings, configure_loader=None) -> None:
        super().__init__(settings, configure_loader)
        self.device_work = settings.get("preprocess", "device") == "device"
        self.mean: tuple | None = None  # per channel; None: pixels / 255 only
        self.std: tuple | None = None
        self.worker_steps: list[str] = []
        self.device_steps: list[str] = []

    def device_batch(self, batch, device: torch.device):
        """``[pixels, labels(, flips)]`` from the workers to ``[images, labels]`` on ``device``."""
        if not self.device_work:
            return move_data_to_device(batch, device)
        pixels, labels, *flips = batch
        flips = flips[0] if flips and flips[0].any() else None  # asked on the host: no sync
        pixels, labels, flips = move_data_to_device([pixels, labels, flips], device)
        return [device_images(pixels, flips, self.mean, self.std), labels]

    def describe(self) -> dict:
        return {
            "data": self.settings.name,
            "batches": "uint8" if self.device_work else "float32",
            "worker": ", ".join(self.worker_steps) or "-",
            "device": ", ".join(["copy", *self.device_steps]),
            "mean": None if self.mean is None else list(self.mean),
            "std": None if self.std is None else list(self.std),
            **self.loading,
        }


class SyntheticImages(ImageData):
    rules = {
        "data.batch_size": Integer(low=1),
        "data.num_classes": Integer(low=2),
        "data.image_size": Integer(low=1),
        "data.channels": Integer(low=1),
        "data.train_samples": Integer(low=1),
        "data.val_samples": Integer(low=1),
        "data.signal": Number(ge=0),
        "data.seed": Integer(low=0),
        "data.preprocess": OneOf(("device", "worker")),
        "data.on_device": OneOf((True, False)),
    }

    def __init__(self, settings, configure_loader=None) -> None:
        super().__init__(settings, configure_loader)
        self.input_shape = (settings.channels, settings.image_size, settings.image_size)
        self.num_classes = settings.num_classes
        self.resident = bool(settings.get("on_device", False))
        self.mean = (SYNTHETIC_MEAN,) * settings.channels
        self.std = (SYNTHETIC_STD,) * settings.channels
        self.worker_steps = [] if self.device_work else ["to_float", "normalize"]
        self.device_steps = ["to_float", "normalize"] if self.device_work else []
        if self.resident:
            self.loader_options = {"collate_fn": whole_batch}

    @classmethod
    def problems(cls, cfg) -> list[str]:
        found = super().problems(cfg)
        if cfg.data.get("on_device") and cfg.data.get("preprocess") == "worker":
            found.append("data.on_device=true keeps uint8 images on the device and converts "
                          "them there, but data.preprocess='worker' asks the workers for floats; "
                          "use data.preprocess=device with on_device")  # fmt: skip
        return found

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        s = self.settings
        generator = torch.Generator().manual_seed(s.seed)
        patterns = torch.randn(s.num_classes, s.channels, 4, 4, generator=generator)
        patterns = F.interpolate(patterns, size=(s.image_size, s.image_size), mode="bilinear")
        device = self.trainer.strategy.root_device if self.trainer else torch.device("cpu")
        made = []
        for count in (s.train_samples, s.val_samples):
            pixels, labels = synthetic_pixels(patterns, count, s.signal, generator)
            if self.resident:
                made.append(ResidentImages(pixels.to(device), labels.to(device)))
            else:
                made.append(Images(pixels, labels, None if self.device_work else self._normalize))
        self.train_set, self.val_set = made

    def _normalize(self, pixels: torch.Tensor) -> torch.Tensor:
        return normalize(pixels, self.mean, self.std)

    def describe(self) -> dict:
        found = super().describe()
        if self.resident:
            found["resident"] = True
            found["worker"] = "none: generated on the device (data.on_device=true)"
            found["device"] = "batches cut on the device, " + ", ".join(self.device_steps)
        return found


def synthetic_pixels(patterns, count: int, signal: float, generator, chunk: int = 256):
    """``count`` uint8 samples of random classes and their labels; generated ``chunk`` samples
    at a time, so a large data set never exists as float32 (4x its bytes)."""
    labels = torch.randint(len(patterns), (count,), generator=generator)
    pixels = torch.empty(count, *patterns.shape[1:], dtype=torch.uint8)
    for start in range(0, count, chunk):
        part = labels[start : start + chunk]
        noise = torch.randn(len(part), *patterns.shape[1:], generator=generator)
        values = signal * patterns[part] + noise
        scale = 255 * SYNTHETIC_STD
        pixels[start : start + chunk] = (values * scale + 127.5).round_().clamp_(0, 255)
    return pixels, labels


class Images(Dataset):
    """``(pixels, label)`` pairs from tensors; ``transform`` (if any) applied per sample."""

    def __init__(self, pixels: torch.Tensor, labels: torch.Tensor, transform=None) -> None:
        self.pixels, self.labels, self.transform = pixels, labels, transform

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int):
        pixels = self.pixels[index]
        return (pixels if self.transform is None else self.transform(pixels)), self.labels[index]


class ResidentImages(Images):
    """Tensors on the training device, cut into a batch at once by one gather (``__getitems__``,
    which torch's DataLoader calls with a batch's indices) instead of sample by sample."""

    def __getitems__(self, indices: list[int]):
        index = torch.tensor(indices)
        if self.pixels.device.type == "cuda":  # pinned, so the copy does not wait for the GPU
            index = index.pin_memory().to(self.pixels.device, non_blocking=True)
        return [self.pixels[index], self.labels[index]]


def whole_batch(batch):
    """The collate function of :class:`ResidentImages`: its batches come whole."""
    return batch


# --- image folders -----------------------------------------------------------------------


class DecodeClock:
    """Images decoded and seconds spent decoding them, per DataLoader worker.

    A shared-memory table written by the workers (one row each, so no two write the same
    place) and read by the training process at the report: nothing crosses the loader.
    """

    ROWS = 65  # the training process, then workers 0..63 (more workers share the last row)

    def __init__(self) -> None:
        self.table = torch.zeros(self.ROWS, 2, dtype=torch.float64).share_memory_()

    def add(self, seconds: float) -> None:
        worker = get_worker_info()
        row = min(self.ROWS - 1, 0 if worker is None else worker.id + 1)
        self.table[row, 0] += 1
        self.table[row, 1] += seconds

    def figures(self) -> dict:
        images, seconds = self.table.sum(0).tolist()
        busy = int((self.table[:, 0] > 0).sum())
        if not images or not seconds:
            return {}
        return {"decoded_images": int(images), "decoding_processes": busy,
                "decode_images_per_s_per_worker": images / seconds}  # fmt: skip


class ImageFiles(Dataset):
    """``(*transform(path), label)`` for a list of ``(path, label)``, each sample timed."""

    def __init__(self, samples: list[tuple[str, int]], transform, clock=None) -> None:
        self.samples, self.transform, self.clock = samples, transform, clock

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int):
        path, label = self.samples[index]
        started = time.perf_counter()
        out = self.transform(path)
        if self.clock is not None:
            self.clock.add(time.perf_counter() - started)
        if isinstance(out, tuple):  # (pixels, flip) or (bytes, flip, box): the label second
            return out[0], label, *out[1:]
        return out, label


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
        train = TrainCrop(s.image_size, (s.min_scale, s.get("max_scale", 1.0)), flip=s.flip,
                          decoder=decoder, draft=s.draft)  # fmt: skip
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
            mean, std, len(subset), list(mean), list(std))  # fmt: skip
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


def _setting_problems(data) -> list[str]:
    """Settings that are each allowed but wrong together, or need a package or a GPU."""
    found = []
    low, high = data.get("min_scale"), data.get("max_scale", 1.0)
    if isinstance(low, (int, float)) and isinstance(high, (int, float)) and low > high:
        found.append(f"data.min_scale={low} is above data.max_scale={high}: the random resized "
                     "crop takes between min_scale and max_scale of the area; swap them")  # fmt: skip
    if data.get("normalize", "given") == "given":
        for key in ("mean", "std"):
            value = data.get(key)
            low = 0 if key == "std" else float("-inf")  # a std of 0 would divide by zero
            if not _numbers(value, 3) or any(v <= low for v in value):
                found.append(f"data.{key}={_plain(value)} is not allowed: expected 3 numbers, one "
                             f"per RGB channel{' (each > 0)' if key == 'std' else ''}, or "
                             "data.normalize=compute to measure them")  # fmt: skip
    decoder = data.get("decoder")
    if decoder == "simplejpeg" and importlib.util.find_spec("simplejpeg") is None:
        found.append("data.decoder=simplejpeg needs the simplejpeg package: pip install "
                     "'tuneup[jpeg]', or use data.decoder=pillow")  # fmt: skip
    if decoder == "nvjpeg":
        found += _nvjpeg_problems(data)
    return found


def _numbers(value, count: int) -> bool:
    return (
        (OmegaConf.is_list(value) or isinstance(value, (list, tuple)))
        and len(value) == count
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
    )


def _plain(value):
    return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value


def _nvjpeg_problems(data) -> list[str]:
    if data.get("preprocess") == "worker":
        return ["data.decoder=nvjpeg decodes on the GPU, but data.preprocess='worker' asks the "
                "workers for finished images; use data.preprocess=device, or data.decoder=pillow"]  # fmt: skip
    if importlib.util.find_spec("torchvision") is None:
        return ["data.decoder=nvjpeg decodes through torchvision.io.decode_jpeg on the GPU, and "
                "torchvision is not installed; install the torchvision matching your torch "
                "(CUDA build), or use data.decoder=pillow"]  # fmt: skip
    if not torch.cuda.is_available():
        return ["data.decoder=nvjpeg decodes on a CUDA GPU and torch sees none here; use "
                "data.decoder=pillow (or simplejpeg)"]  # fmt: skip
    return []


def _jpeg_only(samples: list) -> None:
    others = [path for path, _ in samples if not path.lower().endswith(JPEG_SUFFIXES)]
    if others:
        raise TuneupError(f"data.decoder=nvjpeg decodes JPEG files only, and {len(others)} "
                          f"images are not JPEG (e.g. {others[0]}); use data.decoder=pillow")  # fmt: skip


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


def _subset(samples: list, count: int | None, seed: int) -> list:
    """At most ``count`` samples, a fixed random choice (all classes, not the first ones)."""
    if count is None or count >= len(samples):
        return samples
    order = torch.randperm(len(samples), generator=torch.Generator().manual_seed(seed))
    return [samples[i] for i in sorted(order[:count].tolist())]
