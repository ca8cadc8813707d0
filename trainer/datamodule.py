"""How every data set gets its DataLoaders: the zoo's, and the user's own (``data._target_``).

A data module says what the model will read (``inputs``: ``"images"`` gives
``[B, C, H, W]`` float batches and ``num_classes`` labels; ``"tokens"`` gives
``[B, T]`` int64 inputs and next-token targets, ``num_classes`` being the
vocabulary size; None: a user's data, whatever its samples are), and
``input_shape`` (one sample's input, without the batch) so models and plugins
can be built and checked first.

DataLoaders are made in one place, :meth:`DataModule.loader`: the keyword
arguments are assembled there and handed to ``configure_loader`` (the
``configure_dataloader`` hook of the plugins) before the DataLoader is made. The
training order comes from :mod:`tuneup.trainer.state.data_order`: seeded by the
run's ``seed`` and the epoch, sharded by rank, and resumable mid-epoch.

:class:`UserData` brings the user's data through the same place: a
``LightningDataModule``'s own loaders are remade around their data set, collate
function and worker settings, so the plugins, the resumable order and DDP sharding
apply to them as to the zoo's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import ClassVar

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, RandomSampler, SequentialSampler

from tuneup import TuneupError
from tuneup.trainer.state.data_order import (
    ResumableLoader,
    eval_loader_kwargs,
    train_loader_kwargs,
)
from tuneup.trainer.validation import problems

log = logging.getLogger(__name__)


class DataModule(pl.LightningDataModule):
    inputs: ClassVar[str | None] = "images"  # "images", "tokens", or None: what the model reads
    rules: ClassVar[dict] = {}  # validation rules for keys under ``data.``
    order_seed: int = 0  # the run's seed (cfg.seed): the training order

    def __init__(self, settings, configure_loader: Callable[[dict], None] | None = None) -> None:
        super().__init__()
        self.settings = settings
        self.configure_loader = configure_loader
        self.batch_size: int | None = settings.get("batch_size")
        self.loader_options: dict = {}  # e.g. a user's collate_fn, kept in every loader
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
        return self.loader(self.val_set, train=False) if self.val_set is not None else []

    def loader(self, dataset: Dataset, train: bool) -> DataLoader:
        """A DataLoader over ``dataset``; training batches are shuffled (resumably) and full-sized."""
        kwargs = {
            "dataset": dataset,
            "batch_size": self.batch_size,
            "drop_last": train,
            **self.loader_options,
            **(train_loader_kwargs(dataset, self.order_seed, self.trainer) if train
               else eval_loader_kwargs(self.order_seed)),
        }  # fmt: skip
        if self.configure_loader is not None:
            self.configure_loader(kwargs)
        if not kwargs.get("num_workers"):  # torch refuses these without worker processes
            kwargs.pop("persistent_workers", None)
            kwargs.pop("prefetch_factor", None)
        return (ResumableLoader if train else DataLoader)(**kwargs)


#: DataLoader settings of a user's loader that tuneup keeps when it remakes the loader.
KEPT_LOADER_OPTIONS = ("collate_fn", "num_workers", "pin_memory", "timeout", "worker_init_fn",
                       "persistent_workers", "prefetch_factor", "multiprocessing_context")  # fmt: skip
#: LightningDataModule hooks that act on batches: the user's run as theirs.
BATCH_HOOKS = ("on_before_batch_transfer", "transfer_batch_to_device")


class UserData(DataModule):
    """The user's data, ``data._target_``: a ``LightningDataModule``, or what a callable returned.

    ``source`` is the instantiated target: a LightningDataModule (its ``prepare_data``,
    ``setup``, batch hooks and state run as its own; its training and validation loaders
    are remade around their data sets), or the data sets themselves: ``(train, val)``,
    ``{"train": ..., "val": ...}``, or one training data set (no validation).
    ``data.batch_size`` is the batch per process; null means the data module's own.
    """

    inputs = None

    def __init__(self, source, settings, configure_loader=None, name: str = "custom") -> None:
        super().__init__(settings, configure_loader)
        self.name = name
        self.source = source if isinstance(source, pl.LightningDataModule) else None
        self.own_loader: DataLoader | None = None  # used as it is when it cannot be remade
        if self.source is None:
            self.train_set, self.val_set = datasets_of(source, name)
        else:
            from pytorch_lightning.utilities.model_helpers import is_overridden

            for hook in BATCH_HOOKS:
                if is_overridden(hook, self.source, pl.LightningDataModule):
                    setattr(self, hook, getattr(self.source, hook))

    def prepare_data(self) -> None:
        if self.source is not None:
            self.source.prepare_data()

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None or self.own_loader is not None:
            return
        if self.source is None:
            return
        self.source.trainer = self.trainer
        self.source.setup("fit")
        train = self.source.train_dataloader()
        if not isinstance(train, DataLoader):
            raise TuneupError(f"data._target_={self.name}: train_dataloader() returned "
                              f"{type(train).__name__}, expected a torch DataLoader")  # fmt: skip
        self.loader_options = {k: getattr(train, k) for k in KEPT_LOADER_OPTIONS
                               if hasattr(train, k)}  # fmt: skip
        if not self.loader_options.get("num_workers"):
            self.loader_options.pop("multiprocessing_context", None)
        own = train.batch_size
        if self.batch_size is None:
            self.batch_size = own
        elif own is not None and own != self.batch_size:
            raise TuneupError(
                f"data.batch_size={self.batch_size} but {self.name}.train_dataloader() makes "
                f"batches of {own}; set one of them (data.batch_size=null uses the data module's)"
            )
        if remakeable(train):
            self.train_set = train.dataset
        else:
            log.warning(
                "%s.train_dataloader() uses its own sampler or an iterable data set: it is used "
                "as it is, so a mid-epoch resume starts that epoch again and DDP sharding is "
                "the data module's own", self.name)  # fmt: skip
            self.own_loader = train
        self.val_set = _val_set(self.source)

    def train_dataloader(self) -> DataLoader:
        return self.own_loader if self.own_loader is not None else super().train_dataloader()

    def state_dict(self) -> dict:
        return self.source.state_dict() if self.source is not None else {}

    def load_state_dict(self, state_dict: dict) -> None:
        if self.source is not None:
            self.source.load_state_dict(state_dict)

    def teardown(self, stage: str) -> None:
        if self.source is not None:
            self.source.teardown(stage)

    def sample(self, count: int = 2):
        """A collated batch of the first ``count`` training samples (for checks and FLOPs)."""
        self.setup("fit")
        if self.own_loader is not None:
            return next(iter(self.own_loader))
        collate = self.loader_options.get("collate_fn") or torch.utils.data.default_collate
        return collate([self.train_set[i] for i in range(min(count, len(self.train_set)))])

    @property
    def num_classes(self) -> int | None:
        """What the data says its classes are (``num_classes``, or ``len(classes)``), if it does."""
        for holder in (self.source, self.train_set):
            count = getattr(holder, "num_classes", None)
            if isinstance(count, int):
                return count
            classes = getattr(holder, "classes", None)
            if isinstance(classes, (list, tuple)) and classes:
                return len(classes)
        return None


def remakeable(loader: DataLoader) -> bool:
    """Whether tuneup can remake ``loader`` with its own sampler: a map-style data set read in
    order or shuffled, in batches of a fixed size (not a custom sampler or batch sampler)."""
    sampler_ok = type(loader.sampler) in (RandomSampler, SequentialSampler)
    return (not isinstance(loader.dataset, IterableDataset) and sampler_ok
            and loader.batch_size is not None)  # fmt: skip


def _val_set(source) -> Dataset | None:
    from pytorch_lightning.utilities.model_helpers import is_overridden

    if not is_overridden("val_dataloader", source, pl.LightningDataModule):
        return None
    val = source.val_dataloader()
    return getattr(val, "dataset", None) if isinstance(val, DataLoader) else None


def datasets_of(returned, name: str) -> tuple[Dataset, Dataset | None]:
    """(train, val) from what a data target returned: a pair, a dict, or one data set."""
    if isinstance(returned, Mapping) and "train" in returned:
        return returned["train"], returned.get("val")
    if isinstance(returned, (tuple, list)) and len(returned) == 2:
        return returned[0], returned[1]
    if isinstance(returned, Dataset):
        return returned, None
    raise TuneupError(
        f"data._target_={name} returned {type(returned).__name__}; expected a "
        "LightningDataModule, a (train, val) pair of Datasets, a dict with 'train' (and 'val'), "
        "or one training Dataset"
    )
