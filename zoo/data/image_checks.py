"""``data=imagefolder``'s settings that are each allowed but wrong together, or need a package
or a GPU (the single keys are the data module's ``rules``), and the JPEG-only check of
``data.decoder=nvjpeg``. Used by :mod:`tuneup.zoo.data.image_folder` and :mod:`tuneup.zoo.data.shards`.
"""

from __future__ import annotations

import importlib.util

import torch
from omegaconf import OmegaConf

from tuneup.errors import TuneupError
from tuneup.zoo.data.decoders import JPEG_SUFFIXES


def _setting_problems(data) -> list[str]:
    """Settings that are each allowed but wrong together, or need a package or a GPU."""
    found = []
    low, high = data.get("min_scale"), data.get("max_scale", 1.0)
    if isinstance(low, (int, float)) and isinstance(high, (int, float)) and low > high:
        found.append(
            f"data.min_scale={low} is above data.max_scale={high}: the random resized "
            "crop takes between min_scale and max_scale of the area; swap them"
        )
    if data.get("normalize", "given") == "given":
        for key in ("mean", "std"):
            value = data.get(key)
            low = 0 if key == "std" else float("-inf")  # a std of 0 would divide by zero
            if not _numbers(value, 3) or any(v <= low for v in value):
                found.append(
                    f"data.{key}={_plain(value)} is not allowed: expected 3 numbers, one "
                    f"per RGB channel{' (each > 0)' if key == 'std' else ''}, or "
                    "data.normalize=compute to measure them"
                )
    decoder = data.get("decoder")
    if decoder == "simplejpeg" and importlib.util.find_spec("simplejpeg") is None:
        found.append(
            "data.decoder=simplejpeg needs the simplejpeg package: pip install "
            "'tuneup[jpeg]', or use data.decoder=pillow"
        )
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
        return [
            "data.decoder=nvjpeg decodes on the GPU, but data.preprocess='worker' asks the "
            "workers for finished images; use data.preprocess=device, or data.decoder=pillow"
        ]
    if importlib.util.find_spec("torchvision") is None:
        return [
            "data.decoder=nvjpeg decodes through torchvision.io.decode_jpeg on the GPU, and "
            "torchvision is not installed; install the torchvision matching your torch "
            "(CUDA build), or use data.decoder=pillow"
        ]
    if not torch.cuda.is_available():
        return [
            "data.decoder=nvjpeg decodes on a CUDA GPU and torch sees none here; use "
            "data.decoder=pillow (or simplejpeg)"
        ]
    return []


def _jpeg_only(samples: list) -> None:
    others = [path for path, _ in samples if not path.lower().endswith(JPEG_SUFFIXES)]
    if others:
        raise TuneupError(
            f"data.decoder=nvjpeg decodes JPEG files only, and {len(others)} "
            f"images are not JPEG (e.g. {others[0]}); use data.decoder=pillow"
        )
