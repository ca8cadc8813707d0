"""Image transforms, split between the DataLoader workers and the training device.

The workers do what only a CPU does well, per image: decode, random resized crop and
resize (one antialiased Pillow pass), and the coin of the random flip. What is cheap on
a GPU, per batch, runs there after the copy (:func:`device_images`): flip, uint8 to
float, normalise by the data set's mean and std. A batch therefore crosses PCIe as
uint8, a quarter of float32's bytes. ``preprocess: worker`` keeps everything in the
workers (:class:`OnWorker`), which is also the reference the device path is tested
against: for the same seed both give the model the same batch within float rounding,
because the workers draw the same random numbers in the same order either way.

Crop geometry follows torchvision's ``RandomResizedCrop.get_params``; resizing is
Pillow's antialiased bilinear, as torchvision does for Pillow images. Random numbers
come from torch's RNG, which the DataLoader seeds differently in every worker.

The workers decode through :mod:`tuneup.zoo.data.decoders` (``data.decoder``, ``draft``);
every worker transform takes what those take: a file's path or an
:class:`~tuneup.zoo.data.decoders.InMemory` image, the bytes already read from a shard.
"""

from __future__ import annotations

import io
import math

import numpy as np
import torch
from PIL import Image
from torch.nn import functional as F

from tuneup.zoo.data.decoders import _file, _read, open_source

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


def center_crop_box(width: int, height: int, size: int, crop_fraction: float) -> tuple:
    """The box that "shorter side to ``size / crop_fraction``, centre crop ``size``" keeps, in
    the original image's pixels (so one resize of it does both steps)."""
    side = min(width, height) * size / round(size / crop_fraction)
    left, top = (width - side) / 2, (height - side) / 2
    return left, top, left + side, top + side


# --- decoding and cropping, in the workers ----------------------------------------------


def pixels_chw(hwc: np.ndarray) -> torch.Tensor:
    """``[C, H, W]`` uint8 from Pillow's ``[H, W, C]`` (a view; collating makes it contiguous)."""
    return torch.from_numpy(hwc).permute(2, 0, 1)


class TrainCrop:
    """Training, worker part: random resized crop to ``size``² and the random flip's coin.

    Returns ``(pixels, flip)``: uint8 ``[3, size, size]`` not yet flipped, and whether to flip.
    """

    def __init__(
        self,
        size: int,
        scale=(0.08, 1.0),
        ratio=(3 / 4, 4 / 3),
        flip: bool = True,
        decoder: str = "pillow",
        draft: bool = False,
    ) -> None:
        self.size, self.scale, self.ratio = size, tuple(scale), tuple(ratio)
        self.flip, self.decoder, self.draft = flip, decoder, draft

    def box(self, image_size) -> tuple:
        return random_resized_crop_box(*image_size, self.scale, self.ratio)

    def coin(self) -> bool:
        return self.flip and torch.rand(1).item() < 0.5

    def __call__(self, path) -> tuple[torch.Tensor, bool]:
        source = open_source(path, self.decoder)
        try:
            box = self.box(source.size)
            flip = self.coin()  # after the box: the order of draws of the transform before it
            return pixels_chw(source.crop(box, self.size, self.draft)), flip
        finally:
            source.close()


class CenterCrop(TrainCrop):
    """Validation, worker part: shorter side to ``size / crop_fraction``, centre ``size``²; no flip."""

    def __init__(
        self, size: int, crop_fraction: float = 0.875, decoder: str = "pillow", draft: bool = False
    ) -> None:
        super().__init__(size, flip=False, decoder=decoder, draft=draft)
        self.crop_fraction = crop_fraction

    def box(self, image_size) -> tuple:
        return center_crop_box(*image_size, self.size, self.crop_fraction)

    def coin(self) -> bool:
        return False


class Encoded:
    """``data.decoder=nvjpeg``, worker part: the file's bytes, the crop box and the flip's coin;
    decoding, cropping and resizing happen on the GPU (:func:`decode_on_device`)."""

    def __init__(self, crop: TrainCrop) -> None:
        self.crop = crop

    def __call__(self, path):
        with Image.open(_file(path)) as img:  # the header only: the size, for the crop box
            size = img.size
        box = self.crop.box(size)
        flip = self.crop.coin()
        data = torch.frombuffer(bytearray(_read(path)), dtype=torch.uint8)
        box = torch.tensor([round(v) for v in box])  # integers: precision casts leave them alone
        return data, flip, box


class OnWorker:
    """``preprocess: worker``: the whole transform in the worker, float32 out (the path before
    device preprocessing, and the reference it is tested against)."""

    def __init__(self, crop: TrainCrop, mean, std) -> None:
        self.crop, self.mean, self.std = crop, tuple(mean), tuple(std)

    def __call__(self, path) -> torch.Tensor:
        pixels, flip = self.crop(path)
        return normalize(pixels.flip(-1) if flip else pixels, self.mean, self.std)


# --- on the device, per batch ------------------------------------------------------------


def normalize(pixels: torch.Tensor, mean, std) -> torch.Tensor:
    """Float32 ``(pixels / 255 - mean) / std`` per channel (dim -3), as one operation.

    ``pixels * (1 / (255 std)) - mean / std`` in a single ``addcmul`` that reads the uint8
    pixels and writes floats (one kernel on a GPU, one pass on a CPU); it differs from the
    formula written out by float32 rounding only (below 1e-6, tests/test_data_path.py).
    The worker and the device call this same function, so the two paths agree exactly.
    The two per-channel constants are copied in the stream the work runs in, so a side
    stream never reads a tensor the main stream may still be writing.
    """
    mean, std = torch.tensor(mean, dtype=torch.float64), torch.tensor(std, dtype=torch.float64)
    scale, shift = (1 / (255 * std)).float(), (-mean / std).float()
    scale, shift = (t.view(-1, 1, 1).to(pixels.device, non_blocking=True) for t in (scale, shift))
    return torch.addcmul(shift, pixels, scale)


def device_images(pixels: torch.Tensor, flips: torch.Tensor | None, mean, std) -> torch.Tensor:
    """A uint8 batch ``[B, C, H, W]`` as the model reads it: flipped where ``flips``, normalised.

    Flipping the uint8 batch moves a quarter of the bytes of flipping floats. ``flips`` None:
    no image is flipped (the callers ask the host's copy before the transfer: asking the
    device's here would wait for the copy, on every batch). ``mean`` None: no normalisation
    (``pixels / 255`` only).
    """
    if flips is not None:
        pixels = torch.where(flips.view(-1, 1, 1, 1), pixels.flip(-1), pixels)
    if mean is None:
        return pixels.float().div_(255)
    return normalize(pixels, mean, std)


def decode_on_device(
    encoded: list[torch.Tensor], boxes: torch.Tensor, size: int, device, decode=None
) -> torch.Tensor:
    """``data.decoder=nvjpeg``: JPEG bytes decoded on ``device`` (torchvision's nvJPEG, in one
    batched call), each ``box`` cropped and resized to ``size``² with antialiased bilinear
    interpolation, as uint8 ``[B, 3, size, size]``. ``decode`` replaces the decoder (tests).
    """
    if decode is None:
        from torchvision.io import ImageReadMode, decode_jpeg

        images = decode_jpeg(encoded, mode=ImageReadMode.RGB, device=device)
    else:
        images = decode(encoded, device)
    return torch.stack(
        [crop_resize(img, box, size) for img, box in zip(images, boxes.tolist(), strict=True)]
    )


def crop_resize(image: torch.Tensor, box, size: int) -> torch.Tensor:
    """``box`` of one uint8 ``[3, H, W]`` image resized to ``size``² (antialiased), uint8."""
    left, top, right, bottom = (round(v) for v in box)
    crop = image[None, :, top:bottom, left:right].float()
    out = F.interpolate(
        crop, size=(size, size), mode="bilinear", antialias=True, align_corners=False
    )
    return out[0].round_().clamp_(0, 255).to(torch.uint8)


def collate_encoded(samples: list) -> list:
    """Batch ``(bytes, label, flip, box)`` samples: the bytes stay a list (their lengths differ)."""
    data, labels, flips, boxes = zip(*samples, strict=True)
    return [list(data), torch.tensor(labels), torch.tensor(flips), torch.stack(boxes)]


def decode_with_pillow(encoded: list[torch.Tensor], device) -> list[torch.Tensor]:
    """A stand-in for nvJPEG with the same inputs and outputs (tests, and CPU runs)."""
    images = []
    for data in encoded:
        with Image.open(io.BytesIO(data.numpy().tobytes())) as img:
            images.append(pixels_chw(np.array(img.convert("RGB"))).to(device))
    return images
