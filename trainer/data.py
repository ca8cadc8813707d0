"""Data, by the name in ``conf/data/<name>.yaml``.

``synthetic_images``: every class has a fixed smooth random pattern; a sample
is its class pattern times ``signal`` plus Gaussian noise, so a model can learn
the classes (it is not pure noise) while accuracy is not trivially 100%. The
tensors are generated once, from ``data.seed``, so every run sees the same data.
"""

from __future__ import annotations

import pytorch_lightning as pl
import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from trainer.validation import Integer, Number, problems


class SyntheticImages(pl.LightningDataModule):
    def __init__(self, settings) -> None:
        super().__init__()
        self.settings = settings
        self.input_shape = (settings.channels, settings.image_size, settings.image_size)
        self.num_classes = settings.num_classes
        self.train_set = self.val_set = None

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        s = self.settings
        generator = torch.Generator().manual_seed(s.seed)
        patterns = torch.randn(s.num_classes, s.channels, 4, 4, generator=generator)
        patterns = F.interpolate(patterns, size=(s.image_size, s.image_size), mode="bilinear")
        self.train_set = _sample(patterns, s.train_samples, s.signal, generator)
        self.val_set = _sample(patterns, s.val_samples, s.signal, generator)

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_set, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_set, shuffle=False)

    def _loader(self, dataset, shuffle: bool) -> DataLoader:
        return DataLoader(
            dataset, batch_size=self.settings.batch_size, shuffle=shuffle, drop_last=shuffle
        )


def _sample(patterns, count: int, signal: float, generator) -> TensorDataset:
    labels = torch.randint(len(patterns), (count,), generator=generator)
    noise = torch.randn(count, *patterns.shape[1:], generator=generator)
    return TensorDataset(signal * patterns[labels] + noise, labels)


DATA = {"synthetic_images": SyntheticImages}

RULES = {
    "data.batch_size": Integer(low=1),
    "data.num_classes": Integer(low=2),
    "data.image_size": Integer(low=1),
    "data.channels": Integer(low=1),
    "data.train_samples": Integer(low=1),
    "data.val_samples": Integer(low=1),
    "data.signal": Number(ge=0),
    "data.seed": Integer(low=0),
}


def check_data(cfg) -> list[str]:
    name = cfg.data.name
    if name not in DATA:
        return [f"data.name={name!r} is not allowed: expected one of {', '.join(DATA)}"]
    found = problems(cfg, RULES)
    train, batch = cfg.data.get("train_samples"), cfg.data.get("batch_size")
    if not found and train is not None and batch is not None and train < batch:
        found.append(
            f"data.batch_size={batch} is larger than data.train_samples={train}: "
            "no full training batch can be formed; lower the batch size or add samples"
        )
    return found


def build_data(cfg) -> pl.LightningDataModule:
    return DATA[cfg.data.name](cfg.data)
