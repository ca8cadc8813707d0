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

:class:`~tuneup.trainer.user_data.UserData` brings the user's data through the same place: a
``LightningDataModule``'s own loaders are remade around their data set, collate
function and worker settings, so the plugins, the resumable order and DDP sharding
apply to them as to the zoo's.

Between the loader and the model, Lightning's ``transfer_batch_to_device`` hook is the
data module's (:meth:`DataModule.transfer_batch_to_device`): the copy, then the data set's
own device work (:meth:`DataModule.device_batch`; the zoo's images turn uint8 batches into
normalised floats there), then the precision's input dtype. The data module, not a plugin,
does this because it knows what its workers did and what is left (mean, std, flips), and
because a batch the model cannot read without it (uint8) must never depend on a plugin
being on. A user's batches pass through unchanged: the default device work is the copy.

On CUDA the loaders can run one batch ahead (:class:`PrefetchLoader`, asked for with
``prefetch_to_device`` in the ``configure_dataloader`` kwargs: the ``data_path`` plugin):
the next batch's copy and device work are issued on a side CUDA stream before the current
batch is handed to the loop, so they overlap its step; the transfer hook then makes the
loop's stream wait for that batch only (an event) and marks its tensors as used there
(``record_stream``), so the caching allocator never hands their memory to the side stream
while the step still reads it. The staging sits *below* :class:`ResumableLoader`'s count:
a batch staged but never handed to the loop is not counted as trained, so a mid-epoch
resume stays exact.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import ClassVar

import pytorch_lightning as pl
import torch
from lightning_fabric.utilities.apply_func import move_data_to_device
from pytorch_lightning.utilities.model_helpers import is_overridden
from torch.utils.data import DataLoader, Dataset

from tuneup.errors import TuneupError
from tuneup.trainer.prefetch import PrefetchLoader, ResumablePrefetchLoader, Staged
from tuneup.trainer.state.data_order import (
    ResumableSampler,
    check_a_full_batch,
    eval_loader_kwargs,
    train_loader_kwargs,
)
from tuneup.trainer.validation import problems

# A user's LightningModule with its own transfer_batch_to_device: the data module's hook calls
# it (DataModule.to_device), so Lightning's "it will use the LightningDataModule's" is not so.
warnings.filterwarnings("ignore", message=r".*overridden `transfer_batch_to_device` in both")

#: tuneup's own key in the ``configure_dataloader`` kwargs (not torch's): run one batch ahead on
#: a side CUDA stream (:class:`PrefetchLoader`). True also on CPU, where it only reorders work.
PREFETCH = "prefetch_to_device"
#: The data module's ``loading["prefetch"]`` when it stages batches ahead.
PREFETCHING = "one batch ahead"


class DataModule(pl.LightningDataModule):
    inputs: ClassVar[str | None] = "images"  # "images", "tokens", or None: what the model reads
    rules: ClassVar[dict] = {}  # validation rules for keys under ``data.``
    order_seed: int = 0  # the run's seed (cfg.seed): the training order
    resident: bool = False  # batches are cut from tensors on the device: no workers, no copy

    def __init__(self, settings, configure_loader: Callable[[dict], None] | None = None) -> None:
        super().__init__()
        self.settings = settings
        self.configure_loader = configure_loader
        self.batch_size: int | None = settings.get("batch_size")
        self.loader_options: dict = {}  # e.g. a user's collate_fn, kept in every loader
        self.train_set: Dataset | None = None
        self.val_set: Dataset | None = None
        self.test_set: Dataset | None = None  # mode=test; made on demand: :meth:`test_split`
        self.predict_set: Dataset | None = None  # mode=predict's own split, when one is given
        self.loading: dict = {}  # how the training loader loads: workers, pinning, prefetching
        self._side_stream = None

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

    def test_split(self) -> Dataset | None:
        """The held-out split ``mode=test`` evaluates (None: the data have none). A data module
        whose test split costs something to make makes it here, only when it is asked for."""
        return self.test_set

    def predict_split(self) -> tuple[str, Dataset | None]:
        """What ``mode=predict`` runs the model on: its own split where the data give one, else
        the test split, else the validation split; (its name, the data set)."""
        for name, dataset in (
            ("predict", self.predict_set),
            ("test", self.test_split()),
            ("val", self.val_set),
        ):
            if dataset is not None:
                return name, dataset
        return "none", None

    #: How a user gives this data a test split (the end of mode=test's error without one).
    test_hint: ClassVar[str] = "this data has no test split"

    def test_dataloader(self) -> DataLoader:
        dataset = self.test_split()
        if dataset is None:
            raise TuneupError(
                f"mode=test: data={self.settings.get('name')} has no test split: {self.test_hint}"
            )
        return self.loader(dataset, train=False)

    def predict_dataloader(self) -> DataLoader:
        dataset = self.predict_split()[1]
        if dataset is None:
            raise TuneupError(
                f"mode=predict: data={self.settings.get('name')} has no predict, "
                f"test or validation split: {self.test_hint}"
            )
        return self.loader(dataset, train=False)

    def loader(self, dataset: Dataset, train: bool) -> DataLoader:
        """A DataLoader over ``dataset``; training batches are shuffled (resumably) and full-sized."""
        kwargs = {
            "dataset": dataset,
            "batch_size": self.batch_size,
            "drop_last": train,
            **self.loader_options,
            **(
                train_loader_kwargs(dataset, self.order_seed, self.trainer)
                if train
                else eval_loader_kwargs(self.order_seed)
            ),
        }
        if self.configure_loader is not None:
            self.configure_loader(kwargs)
        if train and isinstance(kwargs.get("sampler"), ResumableSampler) and kwargs["drop_last"]:
            check_a_full_batch(kwargs["sampler"], kwargs["batch_size"])
        if self.resident:  # the samples are on the device already: workers could not reach them
            kwargs.update(num_workers=0, pin_memory=False)
        refused = self.prefetch_refusal(kwargs) if kwargs.pop(PREFETCH, False) else "off"
        if not kwargs.get("num_workers"):  # torch refuses these without worker processes
            kwargs.pop("persistent_workers", None)
            kwargs.pop("prefetch_factor", None)
        if train:
            self.loading = {
                "num_workers": kwargs.get("num_workers", 0),
                "pin_memory": kwargs.get("pin_memory", False),
                "prefetch": refused or PREFETCHING,
            }
        stage = None if refused else self.stage
        return (ResumablePrefetchLoader if train else PrefetchLoader)(stage=stage, **kwargs)

    def prefetch_refusal(self, kwargs: dict) -> str | None:
        """Why batches cannot be staged ahead of the loop here, or None when they can."""
        if self.trainer is None:
            return "off: not in a fit"
        if self.resident:
            return "off: the data are on the device already"
        if not kwargs.get("num_workers"):
            # Loading in this process draws its random numbers (crops, flips) from the stream
            # the model's dropout uses: a batch loaded ahead would be in the checkpoint's RNG
            # state, and a resumed run would draw it again, differently.
            return "off: batches load in the training process (dataloader=workers to prefetch)"
        module = self.trainer.lightning_module
        for hook in BATCH_HOOKS:  # a user's hook must see each batch when the loop takes it
            if hook in vars(self) or is_overridden(hook, module, pl.LightningModule):
                return f"off: a {hook} hook of your own takes each batch as it comes"
        return None

    # -- between the loader and the model ---------------------------------------------------

    def device_batch(self, batch, device: torch.device):
        """``batch`` (as the loader gives it) as the model reads it, on ``device``.

        The default is the copy alone. A data set whose workers leave work for the device
        overrides it (the zoo's images: uint8 to normalised float, flips).
        """
        return move_data_to_device(batch, device)

    def transfer_batch_to_device(self, batch, device: torch.device, dataloader_idx: int):
        """Lightning's transfer hook: a staged batch is handed over, any other copied now."""
        if isinstance(batch, Staged):
            return batch.take()
        return self.to_device(batch, device, dataloader_idx)

    def to_device(self, batch, device: torch.device, dataloader_idx: int = 0):
        """Copy and device work on the current stream; then the precision's input dtype (the
        device work may have made float32 from uint8 after Lightning converted the batch)."""
        module = self.trainer.lightning_module if self.trainer is not None else None
        if module is not None and is_overridden(
            "transfer_batch_to_device", module, pl.LightningModule
        ):
            return module.transfer_batch_to_device(batch, device, dataloader_idx)
        batch = self.device_batch(batch, device)
        if self.trainer is not None:
            batch = self.trainer.precision_plugin.convert_input(batch)
        return batch

    def stage(self, batch) -> Staged:
        """Issue ``batch``'s copy and device work now (the prefetcher calls it one batch ahead):
        on a side stream on CUDA, in place elsewhere."""
        device = self.trainer.strategy.root_device
        batch = self.trainer.precision_plugin.convert_input(batch)  # as Lightning does first
        if device.type != "cuda":
            return Staged(self.to_device(batch, device))
        if self._side_stream is None:
            self._side_stream = torch.cuda.Stream(device)
        with torch.cuda.stream(self._side_stream):
            batch = self.to_device(batch, device)
            return Staged(batch, self._side_stream.record_event())

    def describe(self) -> dict:
        """What happens to the data where (worker, device), for the run summary."""
        return {**self.loading}


#: LightningDataModule hooks that act on batches: the user's run as theirs.
BATCH_HOOKS = ("on_before_batch_transfer", "transfer_batch_to_device")
