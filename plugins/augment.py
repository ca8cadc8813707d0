"""Augmentation on the training device, per sample, chosen by ``augment=off|flip_translate|mixup|cutmix``.

Each image of a training batch gets its own random draw: a horizontal flip (a coin per
sample), a translation (a random crop of the original size from the image padded by
reflection, ``translate`` pixels each way: airbench's flip-and-translate, torchvision's
``RandomCrop(size, padding, padding_mode="reflect")``), and mixup or cutmix with a
partner (the previous sample of the batch; the loader shuffles) and a mixing weight
drawn per sample from Beta(alpha, alpha). torchvision's v2 transforms applied to a batch
draw one crop and one flip for the whole batch; these draw one per sample.

Mixup and cutmix make **soft labels**: ``[B, num_classes]`` float rows (each sums to 1,
two non-zero entries for a mixed pair), which the classification loss takes as
probability targets (``F.cross_entropy``; trainer/task.py). Validation batches are never
touched: the plugin acts only while the trainer trains.

Where: in ``transform_batch``, after the data module turned the uint8 batch into
normalised floats on the device. Every operation here is a per-pixel selection (flip,
crop, cutmix) or a convex combination of two images (mixup), and per-channel
normalisation is affine, so doing them after it gives exactly the images that doing
them on the uint8 pixels first would give (mixup without uint8's rounding). The output
keeps the input's memory format, so the order against ``memory_format=channels_last``
does not matter.

Why our own tensor ops and not Kornia's ``augmentation`` module (which also draws per
sample on the device): for a batch of 256 3x32x32 images on a CPU, flip + translate take
a fraction of Kornia's time (its translate is an affine warp by ``grid_sample``, with
bilinear interpolation, where an integer shift needs only an index); see docs/benchmarks.md
``## Augmentation`` (bench/augment.py), and no extra package to install.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from tuneup import hookimpl
from tuneup.trainer.validation import BOOL, Integer, Number, problems

RULES = {
    "augment.flip": BOOL,
    "augment.translate": Integer(low=0),
    "augment.mixup_alpha": Number(ge=0),
    "augment.cutmix_alpha": Number(ge=0),
    "augment.mix_prob": Number(ge=0, le=1),
}


def memory_format_of(images: torch.Tensor) -> torch.memory_format:
    """channels_last if ``images`` is laid out so (and not trivially), else contiguous."""
    channels_last = images.dim() == 4 and images.shape[1] > 1
    if channels_last and images.is_contiguous(memory_format=torch.channels_last):
        return torch.channels_last
    return torch.contiguous_format


def flip(images: torch.Tensor) -> torch.Tensor:
    """Each image of ``[B, C, H, W]`` mirrored left-right with probability 1/2, its own coin."""
    coins = torch.rand(len(images), device=images.device) < 0.5
    return torch.where(coins[:, None, None, None], images.flip(3), images)


def reflect(index: torch.Tensor, size: int) -> torch.Tensor:
    """Indices outside ``[0, size)`` mirrored back in, as ``F.pad(mode="reflect")`` does
    (the edge pixel itself is not repeated); valid for shifts below ``size``."""
    index = index.abs()
    return torch.where(index >= size, 2 * (size - 1) - index, index)


def translate(images: torch.Tensor, pixels: int, flip: bool = False) -> torch.Tensor:
    """Each image shifted by its own random ``(dy, dx)`` in ``[-pixels, pixels]``, the border
    filled by reflection: a random crop of the original size from the image padded by
    ``pixels`` (reflect). With ``flip``, each image also mirrored left-right on its own coin,
    in the same gather (its column indices reversed). No padded copy is made."""
    if pixels == 0 and not flip:
        return images
    batch, channels, height, width = images.shape
    device = images.device
    shifts = torch.randint(-pixels, pixels + 1, (2, batch, 1), device=device)
    rows = reflect(torch.arange(height, device=device) + shifts[0], height)  # [B, H]
    cols = reflect(torch.arange(width, device=device) + shifts[1], width)  # [B, W]
    if flip:
        coins = torch.rand(batch, 1, device=device) < 0.5
        cols = torch.where(coins, width - 1 - cols, cols)
    # One gather over each image's flattened pixels: ~7x faster on a CPU than indexing with
    # four index tensors (bench/augment.py), the same pixels.
    index = (rows[:, :, None] * width + cols[:, None, :]).view(batch, 1, height * width)
    pixels = images.flatten(2).gather(2, index.expand(batch, channels, height * width))
    return pixels.view(batch, channels, height, width)


def mix_weights(batch: int, alpha: float, prob: float, device) -> torch.Tensor:
    """Per sample: the share of its own image, Beta(alpha, alpha); 1 (unmixed) with
    probability ``1 - prob``."""
    concentration = torch.tensor(float(alpha), device=device)
    weights = torch.distributions.Beta(concentration, concentration).sample((batch,))
    keep = torch.rand(batch, device=device) >= prob
    return torch.where(keep, torch.ones_like(weights), weights)


def cutmix_masks(
    weights: torch.Tensor, height: int, width: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per sample, a box of area ``1 - weight`` of the image at a random centre (clipped at the
    border): ``[B, 1, H, W]`` True where the partner's pixels go, and the weights the clipped
    boxes really leave (own pixels / all pixels)."""
    batch, device = len(weights), weights.device
    side = (1 - weights).sqrt()
    half_h, half_w = (side * height / 2).round().long(), (side * width / 2).round().long()
    centre_y = torch.randint(height, (batch,), device=device)
    centre_x = torch.randint(width, (batch,), device=device)
    rows, cols = torch.arange(height, device=device), torch.arange(width, device=device)
    inside_y = (rows >= (centre_y - half_h)[:, None]) & (rows < (centre_y + half_h)[:, None])
    inside_x = (cols >= (centre_x - half_w)[:, None]) & (cols < (centre_x + half_w)[:, None])
    masks = inside_y[:, :, None] & inside_x[:, None, :]
    kept = 1 - masks.flatten(1).float().mean(1)
    return masks[:, None], kept


def mix(
    images: torch.Tensor,
    labels: torch.Tensor,
    num_classes: int,
    mixup_alpha: float = 0.0,
    cutmix_alpha: float = 0.0,
    prob: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mixup and/or cutmix, each sample with the previous one of the batch; returns the images
    and ``[B, num_classes]`` soft labels. With both alphas, each sample takes one of the two
    (a fair coin)."""
    batch, _, height, width = images.shape
    device = images.device
    partner_images, partner_labels = images.roll(1, 0), labels.roll(1, 0)
    own = F.one_hot(labels, num_classes).float()
    partner = F.one_hot(partner_labels, num_classes).float()
    out, weights = images, torch.ones(batch, device=device)
    if mixup_alpha > 0:
        weights = mix_weights(batch, mixup_alpha, prob, device)
        share = weights.to(images.dtype)[:, None, None, None]
        out = images * share + partner_images * (1 - share)
    if cutmix_alpha > 0:
        masks, kept = cutmix_masks(mix_weights(batch, cutmix_alpha, prob, device), height, width)
        cut = torch.where(masks, partner_images, images)
        if mixup_alpha > 0:
            coins = torch.rand(batch, device=device) < 0.5
            out = torch.where(coins[:, None, None, None], cut, out)
            weights = torch.where(coins, kept, weights)
        else:
            out, weights = cut, kept
    soft = own * weights[:, None] + partner * (1 - weights[:, None])
    return out, soft


def augment_batch(images: torch.Tensor, labels: torch.Tensor, settings, num_classes=None):
    """One training batch through flip, translate, then mixup/cutmix, as ``settings`` (the
    ``augment`` config node) says; the images keep their memory format."""
    layout = memory_format_of(images)
    pixels, flips = settings.get("translate", 0), settings.get("flip", False)
    if pixels:
        images = translate(images, pixels, flip=flips)  # one gather for both
    elif flips:
        images = flip(images)
    if settings.get("mixup_alpha", 0) or settings.get("cutmix_alpha", 0):
        images, labels = mix(
            images,
            labels,
            num_classes,
            settings.get("mixup_alpha", 0),
            settings.get("cutmix_alpha", 0),
            settings.get("mix_prob", 1.0),
        )
    return images.contiguous(memory_format=layout), labels


def mixes(settings) -> bool:
    return bool(settings.get("mixup_alpha", 0) or settings.get("cutmix_alpha", 0))


def unsupported(cfg, plan) -> list[str]:
    """What the run trains that per-sample image augmentation cannot apply to."""
    settings, found = cfg.augment, []
    name = f"augment={settings.get('name')}"
    if plan.lightning:
        return [
            f"{name} changes the batches of tuneup's training step, but model=lightning "
            "trains your LightningModule's own step; augment in your module, or use "
            "augment=off"
        ]
    if plan.task.name != "classification":
        found.append(
            f"{name} augments images for classification, but task={plan.task.name} "
            f"(data={plan.data_name}); use augment=off"
        )
    elif plan.input_shape is None or len(plan.input_shape) != 3:
        shape = None if plan.input_shape is None else list(plan.input_shape)
        found.append(
            f"{name} needs image batches [B, C, H, W], but data={plan.data_name} gives "
            f"samples of shape {shape}; use augment=off"
        )
    elif settings.get("translate", 0) >= min(plan.input_shape[1:]):
        found.append(
            f"augment.translate={settings.translate} is not allowed: expected fewer "
            f"pixels than the image's side ({min(plan.input_shape[1:])})"
        )
    if not mixes(settings):
        return found
    if not getattr(plan.data, "num_classes", None):
        found.append(
            f"{name} makes soft labels over the classes, and data={plan.data_name} "
            "does not say how many it has (num_classes)"
        )
    ops = cfg.get("kernels") and cfg.kernels.get("ops")
    if ops:
        found.append(
            f"{name} makes soft labels (probabilities), but kernels=[{', '.join(ops)}] "
            "computes the loss from integer labels; use kernels=[] with mixup or "
            "cutmix, or augment=flip_translate"
        )
    return found


class Plugin:
    def __init__(self, cfg) -> None:
        self.settings = cfg.augment
        self.num_classes: int | None = None
        self.trainer = None
        self.batches = 0

    @hookimpl
    def check(self, cfg, plan):
        found = problems(cfg, RULES)
        if found or not plan.sound:
            return found
        self.num_classes = getattr(plan.data, "num_classes", None)
        return unsupported(cfg, plan)

    @hookimpl
    def on_fit_start(self, trainer):
        self.trainer = trainer

    @hookimpl
    def transform_batch(self, batch):
        if self.trainer is None or not self.trainer.training:
            return None  # validation, and anything outside training, sees the data as it is
        images, labels, *rest = batch
        images, labels = augment_batch(images, labels, self.settings, self.num_classes)
        self.batches += 1
        return [images, labels, *rest]

    def describe(self):
        keys = ("name", "flip", "translate", "mixup_alpha", "cutmix_alpha", "mix_prob")
        found = {key: self.settings.get(key) for key in keys if key in self.settings}
        return {**found, "augmented_batches": self.batches}
