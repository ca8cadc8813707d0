"""Per-sample augmentation on the device: tuneup's own tensor ops against Kornia's.

Times one batch (``--batch`` images of ``--size`` x ``--size``, 3 channels, float32,
normalised) through a per-sample horizontal flip and a translation by up to
``--translate`` pixels (a random crop of the original size from the image padded by
reflection), each way:

- ``tuneup``: plugins/augment.py (a coin per sample and ``torch.where``; one gather
  with reflected indices);
- ``kornia``: ``kornia.augmentation`` ``RandomHorizontalFlip`` then ``RandomCrop(padding,
  padding_mode="reflect")``, which also draw per sample on the device.

Also mixup and cutmix (tuneup's, per-sample weights) for their cost beside them. Fastest
of ``--repeats`` timed calls after ``--warmup``; on CUDA each call is synchronised.

Then (``--sizes``) what progressive resizing saves: one training step (forward, backward, SGD)
of ``model=small_resnet`` (its defaults: width 16, blocks [1, 1, 1]) on ``--batch`` images at each side, in ms.

    python bench/augment.py                  # CPU (the tables in docs/benchmarks.md)
    python bench/augment.py --device cuda --batch 1024
"""

from __future__ import annotations

import argparse
import importlib.util
import time

import torch
from omegaconf import OmegaConf

from tuneup.plugins.augment import augment_batch, flip, mix, translate


def timed(fn, repeats: int, warmup: int, device: torch.device) -> float:
    """Median milliseconds of ``fn()``."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        started = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append((time.perf_counter() - started) * 1000)
    return min(times)  # the least disturbed call: the machine may be shared


def kornia_flip_translate(size: int, pixels: int):
    import kornia.augmentation as K

    return K.AugmentationSequential(
        K.RandomHorizontalFlip(p=0.5),
        K.RandomCrop((size, size), padding=pixels, padding_mode="reflect", p=1.0),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--translate", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--sizes", default="16,24,32", help="sides for the step-time table")
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.manual_seed(0)
    images = torch.randn(args.batch, 3, args.size, args.size, device=device)
    labels = torch.randint(10, (args.batch,), device=device)
    settings = OmegaConf.create({"flip": True, "translate": args.translate})
    rows = {
        "tuneup flip": lambda: flip(images),
        "tuneup translate": lambda: translate(images, args.translate),
        "tuneup flip + translate": lambda: augment_batch(images, labels, settings),
        "tuneup mixup (alpha 0.2)": lambda: mix(images, labels, 10, mixup_alpha=0.2),
        "tuneup cutmix (alpha 1.0)": lambda: mix(images, labels, 10, cutmix_alpha=1.0),
    }
    if importlib.util.find_spec("kornia") is not None:
        import kornia

        pipeline = kornia_flip_translate(args.size, args.translate).to(device)
        rows[f"kornia {kornia.__version__} flip + translate"] = lambda: pipeline(images)
    else:
        print("kornia is not installed (pip install kornia): its row is left out")
    threads = torch.get_num_threads()
    print(
        f"{args.batch} x 3 x {args.size} x {args.size} float32 on {device} "
        f"({threads} threads), translate {args.translate} px; fastest of {args.repeats}"
    )
    print("| operation | ms per batch |\n|---|---:|")
    for name, fn in rows.items():
        print(f"| {name} | {timed(fn, args.repeats, args.warmup, device):.3f} |")
    step_times(args, device)


def step_times(args, device: torch.device) -> None:
    """One small_resnet training step per image side: what a smaller side saves."""
    from tuneup.zoo.models.small import SmallResNet

    model = SmallResNet(in_channels=3, num_classes=10, width=16, blocks=[1, 1, 1]).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    labels = torch.randint(10, (args.batch,), device=device)
    print(f"\n| side | small_resnet step, ms (batch {args.batch}) |\n|---:|---:|")
    for side in (int(s) for s in args.sizes.split(",")):
        images = torch.randn(args.batch, 3, side, side, device=device)

        def step(images=images):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(images), labels).backward()
            optimizer.step()

        print(f"| {side} | {timed(step, max(5, args.repeats // 10), 2, device):.1f} |")


if __name__ == "__main__":
    main()
