"""Decoding an image in the DataLoader workers, by ``data.decoder``: the file's header for
its size, then only the pixels a crop needs. :mod:`tuneup.zoo.data.transforms` crops and
flips what these give.

Decoders: ``pillow``; ``simplejpeg`` (libjpeg-turbo without Pillow's overhead; optional,
``pip install 'tuneup[jpeg]'``); ``nvjpeg`` decodes on the GPU instead, its worker part and
its device part in :mod:`tuneup.zoo.data.transforms` (:class:`~tuneup.zoo.data.transforms.Encoded`,
:func:`~tuneup.zoo.data.transforms.decode_on_device`). With ``draft`` a JPEG is decoded at
1/2, 1/4 or 1/8 of its size (libjpeg's DCT scaling, far cheaper than decoding all and
shrinking) whenever the crop still has ``size`` pixels on both sides after the reduction.

Every decoder takes a file's path or an :class:`InMemory` image: the encoded bytes already
read, as ``data=shards`` reads them from a shard (the same decode, crop and draws).
"""

from __future__ import annotations

import io
import math
from typing import NamedTuple

import numpy as np
from PIL import Image

#: ``data.decoder`` choices.
DECODERS = ("pillow", "simplejpeg", "nvjpeg")
JPEG_SUFFIXES = (".jpg", ".jpeg")


def draft_factor(box, size: int) -> int:
    """The largest DCT reduction (8, 4, 2 or 1) after which ``box`` still spans ``size`` pixels."""
    shorter = min(box[2] - box[0], box[3] - box[1])
    return next(f for f in (8, 4, 2, 1) if f == 1 or shorter / f >= size)


class InMemory(NamedTuple):
    """An encoded image already read (a shard's sample): its bytes, and its file's suffix
    (``.jpg``, ``.png``...), which says the format as a file's name does."""

    data: bytes
    suffix: str


def _is_jpeg(path) -> bool:
    name = path.suffix if isinstance(path, InMemory) else path
    return name.lower().endswith(JPEG_SUFFIXES)


def _file(path):
    """What Pillow opens: the path, or the bytes as a file."""
    return io.BytesIO(path.data) if isinstance(path, InMemory) else path


def _read(path) -> bytes:
    if isinstance(path, InMemory):
        return path.data
    with open(path, "rb") as f:
        return f.read()


class PillowSource:
    """An image file opened lazily: its size is read from the header, pixels on demand."""

    def __init__(self, path) -> None:
        self.image = Image.open(_file(path))
        self.size = self.image.size

    def crop(self, box, size: int, draft: bool) -> np.ndarray:
        """``box`` of the image resized to ``size`` x ``size``: uint8 ``[size, size, 3]``."""
        img, factor = self.image, draft_factor(box, size) if draft else 1
        if factor > 1 and img.format == "JPEG":
            img.draft("RGB", (img.size[0] // factor, img.size[1] // factor))
        return _resize(img.convert("RGB"), self.size, box, size)

    def close(self) -> None:
        self.image.close()


class SimplejpegSource(PillowSource):
    """A JPEG decoded by simplejpeg (libjpeg-turbo), with its own scaled decoding; other
    files go through Pillow."""

    def __init__(self, path) -> None:
        import simplejpeg

        self.jpeg = _is_jpeg(path)
        if not self.jpeg:
            super().__init__(path)
            return
        self.data = _read(path)
        self.decoder = simplejpeg
        self.size = tuple(simplejpeg.decode_jpeg_header(self.data)[1::-1])

    def crop(self, box, size: int, draft: bool) -> np.ndarray:
        if not self.jpeg:
            return super().crop(box, size, draft)
        width, height = self.size
        low = (0, 0)  # simplejpeg picks the strongest reduction that keeps these sizes
        if draft:
            low = (
                math.ceil(width * size / (box[2] - box[0])),
                math.ceil(height * size / (box[3] - box[1])),
            )
        pixels = self.decoder.decode_jpeg(
            self.data, colorspace="RGB", min_width=low[0], min_height=low[1]
        )
        return _resize(Image.fromarray(pixels), self.size, box, size)

    def close(self) -> None:
        if not self.jpeg:
            super().close()


def _resize(img: Image.Image, full_size, box, size: int) -> np.ndarray:
    """``box`` (in the full image's pixels) of ``img`` (maybe decoded smaller) to ``size``²."""
    scale = _decoded_scale(full_size[0], img.size[0]), _decoded_scale(full_size[1], img.size[1])
    box = (box[0] * scale[0], box[1] * scale[1], box[2] * scale[0], box[3] * scale[1])
    return np.array(img.resize((size, size), Image.Resampling.BILINEAR, box=box))


def _decoded_scale(full: int, decoded: int) -> float:
    """The scale libjpeg decoded at: a multiple of 1/8 (its DCT scaling), of which ``decoded``
    is ``full`` times it rounded up; 1 when nothing was reduced."""
    eighths = round(8 * decoded / full)
    return eighths / 8 if eighths else decoded / full


def open_source(path, decoder: str):
    return SimplejpegSource(path) if decoder == "simplejpeg" else PillowSource(path)
