"""What every tuneup data module shares: its input kind, its checks, and how it makes DataLoaders.

A data module says what the model will read (``inputs``: ``"images"`` gives
``[B, C, H, W]`` float batches and ``num_classes`` labels; ``"tokens"`` gives
``[B, T]`` int64 inputs and next-token targets, ``num_classes`` being the
vocabulary size), and ``input_shape`` (one sample, without the batch) before
anything is loaded, so models and plugins can be built and checked first.

DataLoaders are made in one place, :meth:`DataModule.loader`: the keyword
arguments are assembled there and handed to ``configure_loader`` (the
``configure_dataloader`` hook of the plugins) before ``DataLoader(**kwargs)``.
The training order comes from :mod:`trainer.sampling`: seeded by the run's
``seed`` and the epoch, and resumable mid-epoch from a checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import pytorch_lightning as pl
from torch.utils.data import DataLoader, Dataset

from trainer.sampling import ResumableLoader, eval_loader_kwargs, train_loader_kwargs
from trainer.validation import problems


class DataModule(pl.LightningDataModule):
    inputs: ClassVar[str] = "images"  # "images" or "tokens": what the model reads
    rules: ClassVar[dict] = {}  # validation rules for keys under ``data.``
    order_seed: int = 0  # the run's seed (cfg.seed, set by build_data): the training order

    def __init__(self, settings, configure_loader: Callable[[dict], None] | None = None) -> None:
        super().__init__()
        self.settings = settings
        self.configure_loader = configure_loader
        self.train_set: Dataset | None = None
        self.val_set: Dataset | None = None

    @classmethod
    def problems(cls, cfg) -> list[str]:
        """Problems with ``cfg.data`` for this data module (rules, then paths and sizes)."""
        found = problems(cfg, cls.rules)
        train, batch = cfg.data.get("train_samples"), cfg.data.get("batch_size")
        if not found and train is not None and batch is not None and train < batch:
            found.append(
                f"data.batch_size={batch} is larger than data.train_samples={train}: "
                "no full training batch can be formed; lower the batch size or add samples"
            )
        return found

    def train_dataloader(self) -> DataLoader:
        return self.loader(self.train_set, train=True)

    def val_dataloader(self) -> DataLoader:
        return self.loader(self.val_set, train=False)

    def loader(self, dataset: Dataset, train: bool) -> DataLoader:
        """A DataLoader over ``dataset``; training batches are shuffled (resumably) and full-sized."""
        kwargs = {
            "dataset": dataset,
            "batch_size": self.settings.batch_size,
            "drop_last": train,
            **(train_loader_kwargs(dataset, self.order_seed, self.trainer) if train
               else eval_loader_kwargs(self.order_seed)),
        }  # fmt: skip
        if self.configure_loader is not None:
            self.configure_loader(kwargs)
        return (ResumableLoader if train else DataLoader)(**kwargs)
