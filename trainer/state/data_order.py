"""The training data order: seeded, epoch-aware, sharded by rank, and resumable mid-epoch.

A run's order is a function of ``(seed, epoch)`` only, as with torch's
``DistributedSampler``: epoch ``e`` visits ``randperm(len(dataset))`` drawn from
``seed + e``, padded to a multiple of ``num_replicas``, and rank ``r`` takes
every ``num_replicas``-th index from ``r``. Nothing is drawn from the global
RNGs, so the order does not depend on what else ran (a validation, a resume).

Resuming mid-epoch needs the place in the epoch: :class:`ResumableSampler`'s
state is ``epoch`` + ``position`` (samples of this rank's share already
trained on), and it yields the epoch's order from ``position``. The position
is counted by :class:`ResumableLoader` as it hands batches to the loop, not as
the sampler gives out indices: DataLoader workers fetch indices ahead of time.
The loader has ``state_dict``/``load_state_dict``, which is how Lightning
recognises a resumable loader (``_Stateful``), but Lightning's own restore
(``FitLoop._load_combined_loader_states``) does not happen when the training
DataLoader was made before the loop state is loaded, which is the case
whenever ``configure_optimizers`` asks for ``trainer.estimated_stepping_batches``
(ours does, for the LR schedule). So the module saves :func:`data_order` in the
checkpoint and calls :func:`restore_data_order` when training starts: after
the loader exists and before its first batch (iteration is lazy).

Data modules use it through :func:`train_loader_kwargs` and
:class:`ResumableLoader`. Under DDP the sampler shards itself (``rank``,
``num_replicas``); the Trainer must then not wrap it in a DistributedSampler
(``use_distributed_sampler=False``, set in trainer/runner.py).
"""

from __future__ import annotations

import math

import torch
from torch.utils.data import DataLoader, Sampler

from tuneup import TuneupError


class ResumableSampler(Sampler[int]):
    """Indices of one rank's share of each epoch, from ``position`` on."""

    def __init__(self, size: int, seed: int = 0, shuffle: bool = True, rank: int = 0,
                 num_replicas: int = 1) -> None:  # fmt: skip
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank={rank} must be in [0, num_replicas={num_replicas})")
        self.size, self.seed, self.shuffle = size, seed, shuffle
        self.rank, self.num_replicas = rank, num_replicas
        self.epoch = 0
        self.position = 0

    def __len__(self) -> int:
        """This rank's samples in a whole epoch (Lightning counts an epoch's batches from it)."""
        return math.ceil(self.size / self.num_replicas)

    def order(self, epoch: int) -> list[int]:
        """This rank's indices for ``epoch``, from the start."""
        if self.shuffle:
            generator = torch.Generator().manual_seed(self.seed + epoch)
            indices = torch.randperm(self.size, generator=generator).tolist()
        else:
            indices = list(range(self.size))
        padding = len(self) * self.num_replicas - self.size
        indices += (indices * math.ceil(padding / max(1, self.size)))[:padding]
        return indices[self.rank :: self.num_replicas]

    def __iter__(self):
        return iter(self.order(self.epoch)[self.position :])

    def set_epoch(self, epoch: int) -> None:
        """Lightning calls this at every epoch start; a new epoch starts at its beginning."""
        if epoch != self.epoch:
            self.epoch, self.position = epoch, 0

    def advance(self, samples: int) -> None:
        self.position = min(len(self), self.position + samples)

    def state_dict(self) -> dict:
        """Where the next sample comes from; a finished epoch is saved as the next one's start."""
        epoch, position = self.epoch, self.position
        if position >= len(self):
            epoch, position = epoch + 1, 0
        return {"epoch": epoch, "position": position, "seed": self.seed, "size": self.size,
                "num_replicas": self.num_replicas}  # fmt: skip

    def load_state_dict(self, state: dict) -> None:
        if state["position"] and (state["size"], state["num_replicas"]) != (
            self.size, self.num_replicas,
        ):  # fmt: skip
            raise TuneupError(
                f"cannot resume mid-epoch: the checkpoint stopped {epoch_samples(state)} samples into "
                f"epoch {state['epoch']} of a dataset of {state['size']} samples over "
                f"{state['num_replicas']} data shard(s); this run has {self.size} samples over "
                f"{self.num_replicas}. Resume with the same data and world size, or from a "
                "checkpoint saved at an epoch end"
            )
        self.epoch, self.position, self.seed = state["epoch"], state["position"], state["seed"]


def epoch_samples(state: dict) -> int:
    """The samples of a saved epoch already trained, over all shards (``position`` is one's)."""
    return int(state["position"]) * int(state.get("num_replicas") or 1)


class ResumableLoader(DataLoader):
    """A DataLoader over a :class:`ResumableSampler` that counts the batches it hands out.

    Its ``state_dict`` is the sampler's, advanced by the samples of every batch
    already returned. Batches are not counted when workers load them, only when
    the loop takes them, so the count is what training has seen. Iteration is
    lazy (nothing is fetched before the first ``next``), so the sampler's epoch
    is set before any index is drawn. The DataLoader's own generator (worker
    seeds) is reseeded from (seed, epoch): no draw from the global torch RNG.
    """

    def __iter__(self):
        sampler = self.sampler
        if self.generator is not None:
            self.generator.manual_seed(((sampler.seed << 20) + sampler.epoch) % (1 << 63))
        for batch in super().__iter__():
            sampler.advance(self.batch_size)
            yield batch

    def state_dict(self) -> dict:
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.sampler.load_state_dict(state)


def data_shard(trainer=None) -> tuple[int, int]:
    """(this process's data shard, the number of shards) of the epoch.

    Every process is its own shard under DDP and FSDP; under tensor parallelism the
    processes of one tensor-parallel group train on the same samples, so the shards are
    the data-parallel ranks. Data sets that shard by rank (the resumable sampler, a
    streaming data set) ask this, never ``trainer.global_rank`` directly.
    """
    if trainer is None:
        return 0, 1
    shard = getattr(trainer.strategy, "data_shard", None)
    return shard() if callable(shard) else (trainer.global_rank, trainer.world_size)


def train_loader_kwargs(dataset, seed: int, trainer=None) -> dict:
    """``sampler`` and ``generator`` for a resumable training DataLoader (use :class:`ResumableLoader`).

    ``trainer`` (the data module's, once Lightning attached it) gives the rank
    and the number of processes the data is sharded over.
    """
    rank, replicas = data_shard(trainer)
    sampler = ResumableSampler(len(dataset), seed, shuffle=True, rank=rank, num_replicas=replicas)
    return {"sampler": sampler, "generator": torch.Generator()}


def eval_loader_kwargs(seed: int) -> dict:
    """A generator of its own for an evaluation DataLoader: iterating it draws nothing from the
    global torch RNG, so a validation leaves the training run's random stream untouched."""
    return {"generator": torch.Generator().manual_seed(seed)}


def data_order(trainer) -> dict | None:
    """The training loader's state (epoch, position...), or None when it is not resumable."""
    loader = trainer.train_dataloader
    return loader.state_dict() if isinstance(loader, ResumableLoader) else None


def restore_data_order(trainer, state: dict | None) -> None:
    """Put the training loader where :func:`data_order` found it; call before its first batch."""
    loader = trainer.train_dataloader
    if state is not None and isinstance(loader, ResumableLoader):
        loader.load_state_dict(state)
