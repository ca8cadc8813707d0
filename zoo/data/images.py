"""Image data in general: the data module image data sets share, and images held in memory.

The synthetic images are in :mod:`tuneup.zoo.data.synthetic_images`, the image folder in
:mod:`tuneup.zoo.data.image_folder` (its files in :mod:`~tuneup.zoo.data.image_files`, its
settings' checks in :mod:`~tuneup.zoo.data.image_checks`): split by concern (issue 32).

Both image data sets hand the model ``[B, C, H, W]`` float batches, normalised per channel,
and both, by default (``data.preprocess=device``), send them from the DataLoader as **uint8**:
the workers do the per-image work (decode, crop, resize), and the data module's
:meth:`ImageData.device_batch` does the per-batch rest on the training device after
the copy (flip, to float, normalise; :func:`~tuneup.zoo.data.transforms.device_images`).
A batch then crosses PCIe at a quarter of float32's bytes and the GPU, not a worker,
does the arithmetic. ``data.preprocess=worker`` does it all in the workers (float32
batches), the path this replaced, kept as the reference: for the same seed the model
sees the same batches either way, within float rounding (tests/test_data_path.py).
"""

from __future__ import annotations

import torch
from lightning_fabric.utilities.apply_func import move_data_to_device
from torch.utils.data import Dataset

from tuneup.trainer.datamodule import DataModule
from tuneup.zoo.data.transforms import device_images


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
