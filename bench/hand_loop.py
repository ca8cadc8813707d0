"""The ceiling beside every throughput figure: ResNet training in a plain, hand-written PyTorch loop.

No Lightning, no tuneup: the model (tuneup's zoo ResNet, torchvision's layout), SGD as
``optimizer=sgd`` (lr 0.05, momentum 0.9, Nesterov, weight decay 5e-4), bf16 autocast for
``--precision amp``, ``channels_last`` and ``Module.compile()`` when asked, and one of
three sources of batches:

- ``gpu``: ten synthetic batches made on the GPU once and reused; no data path at all,
  so this is the model alone (the figure to reach);
- ``fp32-loader``: float32 samples through a DataLoader (``--workers`` workers, pinned
  memory), copied with ``non_blocking``: the classic data path;
- ``uint8-loader``: uint8 samples through the same DataLoader, made floats and normalised
  on the GPU after the copy (NVIDIA's reference recipe, without its side stream).

Prints one JSON line: ``{"data": ..., "samples_per_s": ..., "step_ms": ...}``; the time
is that of the steps after ``--warmup``, between two device synchronisations.

    python bench/hand_loop.py --data gpu --precision amp --channels-last
    python bench/hand_loop.py --device cpu --image-size 32 --batch-size 8 --width 8 --steps 6 --warmup 2
"""

from __future__ import annotations

import argparse
import json
import time
from contextlib import nullcontext

import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from tuneup.zoo.models import resnet

MEAN, STD = (0.5, 0.5, 0.5), (0.125, 0.125, 0.125)  # synthetic_images' pixels
SOURCES = ("gpu", "fp32-loader", "uint8-loader")


def batches(args, device):
    """An endless iterator of ``(x, y)`` on ``device`` from the source ``args.data``."""
    size, count = (args.batch_size, 3, args.image_size, args.image_size), 10 * args.batch_size
    labels = torch.randint(args.classes, (count,))
    pixels = torch.randint(0, 256, (count, *size[1:]), dtype=torch.uint8)
    if args.data == "gpu":
        x = [normalize(pixels[i : i + size[0]].to(device), args) for i in range(0, count, size[0])]
        y = [labels[i : i + size[0]].to(device) for i in range(0, count, size[0])]
        while True:
            yield from zip(x, y, strict=True)
    samples = pixels if args.data == "uint8-loader" else normalize(pixels, args)
    loader = DataLoader(
        TensorDataset(samples, labels),
        batch_size=size[0],
        shuffle=True,
        drop_last=True,
        num_workers=args.workers,
        pin_memory=device.type == "cuda",
        persistent_workers=args.workers > 0,
    )
    while True:
        for x, y in loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            yield (normalize(x, args) if x.dtype == torch.uint8 else _layout(x, args)), y


def normalize(pixels: torch.Tensor, args) -> torch.Tensor:
    mean = torch.tensor(MEAN, device=pixels.device).view(-1, 1, 1)
    std = torch.tensor(STD, device=pixels.device).view(-1, 1, 1)
    return _layout((pixels.float() / 255 - mean) / std, args)


def _layout(x: torch.Tensor, args) -> torch.Tensor:
    return x.contiguous(memory_format=torch.channels_last) if args.channels_last else x


def train(args) -> dict:
    device = torch.device(args.device)
    model = resnet(
        args.model, args.classes, (3, args.image_size, args.image_size), width=args.width
    ).to(device)
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(
        model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=5e-4
    )
    if args.compile:
        model.compile()
    amp = args.precision == "amp"
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if amp else nullcontext()
    source = batches(args, device)
    for step in range(args.steps):
        if step == args.warmup:
            _sync(device)
            started = time.perf_counter()
        x, y = next(source)
        with autocast:
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    _sync(device)
    seconds = time.perf_counter() - started
    measured = args.steps - args.warmup
    return {
        "data": args.data,
        "precision": args.precision,
        "channels_last": args.channels_last,
        "compile": args.compile,
        "samples_per_s": measured * args.batch_size / seconds,
        "step_ms": seconds / measured * 1e3,
        "device": _name(device),
    }


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _name(device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", choices=SOURCES, default="gpu")
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--precision", choices=("fp32", "amp"), default="amp")
    parser.add_argument("--channels-last", action="store_true")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    if args.precision == "fp32" and args.device == "cuda":  # as tuneup's precision=fp32: no TF32
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    print(json.dumps(train(args)))


if __name__ == "__main__":
    main()
