"""The user's own data, ``data._target_``, through :class:`~tuneup.trainer.datamodule.DataModule`:
a ``LightningDataModule``'s loaders remade around their data sets, or the data sets a callable
returned, so that the plugins, the resumable order and DDP sharding apply to them as to the
zoo's."""

from __future__ import annotations

import logging
from collections.abc import Mapping

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, RandomSampler, SequentialSampler

from tuneup.errors import TuneupError
from tuneup.trainer.datamodule import BATCH_HOOKS, DataModule

log = logging.getLogger(__name__)

#: DataLoader settings of a user's loader that tuneup keeps when it remakes the loader.
KEPT_LOADER_OPTIONS = (
    "collate_fn",
    "num_workers",
    "pin_memory",
    "timeout",
    "worker_init_fn",
    "persistent_workers",
    "prefetch_factor",
    "multiprocessing_context",
)


class UserData(DataModule):
    """The user's data, ``data._target_``: a ``LightningDataModule``, or what a callable returned.

    ``source`` is the instantiated target: a LightningDataModule (its ``prepare_data``,
    ``setup``, batch hooks and state run as its own; its training and validation loaders
    are remade around their data sets), or the data sets themselves: ``(train, val)``,
    ``{"train": ..., "val": ...}``, or one training data set (no validation).
    ``data.batch_size`` is the batch per process; null means the data module's own.
    """

    inputs = None
    test_hint = (
        "return (train, val, test) or {'train': ..., 'val': ..., 'test': ...} from "
        "data._target_, or give your LightningDataModule a test_dataloader"
    )

    def __init__(self, source, settings, configure_loader=None, name: str = "custom") -> None:
        super().__init__(settings, configure_loader)
        self.name = name
        self.source = source if isinstance(source, pl.LightningDataModule) else None
        self.own_loader: DataLoader | None = None  # used as it is when it cannot be remade
        if self.source is None:
            found = datasets_of(source, name)
            self.train_set, self.val_set, self.test_set, self.predict_set = found
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
            raise TuneupError(
                f"data._target_={self.name}: train_dataloader() returned "
                f"{type(train).__name__}, expected a torch DataLoader"
            )
        self.loader_options = {
            k: getattr(train, k) for k in KEPT_LOADER_OPTIONS if hasattr(train, k)
        }
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
                "the data module's own",
                self.name,
            )
            self.own_loader = train
        self.val_set = _own_set(self.source, "val_dataloader")

    def test_split(self) -> Dataset | None:
        if self.source is not None and self.test_set is None:  # its test_dataloader's data set
            self.source.setup("test")
            self.test_set = _own_set(self.source, "test_dataloader")
        return self.test_set

    def predict_split(self) -> tuple[str, Dataset | None]:
        if self.source is not None and self.predict_set is None:
            self.source.setup("predict")
            self.predict_set = _own_set(self.source, "predict_dataloader")
        return super().predict_split()

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

    def describe(self) -> dict:
        return {
            "data": self.name,
            "batches": "as your data set gives them",
            "device": "copy",
            **self.loading,
        }

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
    return (
        not isinstance(loader.dataset, IterableDataset)
        and sampler_ok
        and loader.batch_size is not None
    )


def _own_set(source, hook: str) -> Dataset | None:
    """The data set of a LightningDataModule's ``val_dataloader`` (``test_dataloader``,
    ``predict_dataloader``), remade by tuneup like the training one; None where it has none."""
    from pytorch_lightning.utilities.model_helpers import is_overridden

    if not is_overridden(hook, source, pl.LightningDataModule):
        return None
    loader = getattr(source, hook)()
    return getattr(loader, "dataset", None) if isinstance(loader, DataLoader) else None


#: The splits a data target may return by name (a dict), and in a tuple's order.
SPLITS = ("train", "val", "test", "predict")


def datasets_of(returned, name: str) -> tuple[Dataset | None, ...]:
    """(train, val, test, predict) from what a data target returned: a tuple ``(train, val)``
    or ``(train, val, test)``, a dict with ``train`` (and ``val``, ``test``, ``predict``), or
    one training data set. A split it does not give is None."""
    if isinstance(returned, Mapping) and "train" in returned:
        unknown = sorted(set(returned) - set(SPLITS))
        if unknown:
            raise TuneupError(
                f"data._target_={name} returned a dict with {unknown}; its keys "
                f"are the splits: {', '.join(SPLITS)}"
            )
        return tuple(returned.get(split) for split in SPLITS)
    if isinstance(returned, (tuple, list)) and len(returned) in (2, 3):
        return (*returned, *(None,) * (len(SPLITS) - len(returned)))
    if isinstance(returned, Dataset):
        return returned, None, None, None
    raise TuneupError(
        f"data._target_={name} returned {type(returned).__name__}; expected a "
        "LightningDataModule, a (train, val) or (train, val, test) tuple of Datasets, a dict "
        "with 'train' (and 'val', 'test', 'predict'), or one training Dataset"
    )
