"""``data=synthetic_images``: every class has a fixed smooth random pattern; a sample is its
class pattern times ``signal`` plus Gaussian noise, stored as uint8 pixels
``127.5 + 31.875 * value`` (normalised back with mean 0.5, std 0.125: values beyond 4
standard deviations clip). Generated once from ``data.seed``, so every run sees the same
data; ``data.test_samples`` more are drawn after them for ``mode=test``. ``data.on_device=true`` generates them into the training device's memory and cuts
batches there: no worker, no copy, the model alone (NVIDIA's "synthetic" backend).

What image data share (uint8 batches, the device's part) is in :mod:`tuneup.zoo.data.images`.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from tuneup.trainer.validation import Integer, Number, OneOf
from tuneup.zoo.data.images import ImageData, Images, ResidentImages, whole_batch
from tuneup.zoo.data.transforms import normalize

#: synthetic_images: pixel = 127.5 + 31.875 * value, so value = (pixel / 255 - 0.5) / 0.125.
SYNTHETIC_MEAN, SYNTHETIC_STD = 0.5, 0.125


class SyntheticImages(ImageData):
    rules = {
        "data.batch_size": Integer(low=1),
        "data.num_classes": Integer(low=2),
        "data.image_size": Integer(low=1),
        "data.channels": Integer(low=1),
        "data.train_samples": Integer(low=1),
        "data.val_samples": Integer(low=1),
        "data.test_samples": Integer(low=0),
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
            found.append(
                "data.on_device=true keeps uint8 images on the device and converts "
                "them there, but data.preprocess='worker' asks the workers for floats; "
                "use data.preprocess=device with on_device"
            )
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
        self._held_out = (patterns, generator.get_state(), device)  # the test split's draws

    test_hint = "give data.test_samples=N (held-out samples drawn after train and val)"

    def test_split(self):
        """``data.test_samples`` more samples of the same classes, drawn after the training and
        validation ones from the same seeded stream: held out, the same for every run."""
        if self.test_set is None and self.settings.get("test_samples"):
            self.setup("test")
            patterns, state, device = self._held_out
            generator = torch.Generator()
            generator.set_state(state)
            pixels, labels = synthetic_pixels(
                patterns, self.settings.test_samples, self.settings.signal, generator
            )
            self.test_set = (
                ResidentImages(pixels.to(device), labels.to(device))
                if self.resident
                else Images(pixels, labels, None if self.device_work else self._normalize)
            )
        return self.test_set

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
