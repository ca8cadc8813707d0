"""The training data order: seeded, epoch-aware, sharded by rank, and resumable mid-epoch.

A run's order is a function of ``(seed, epoch)`` only, as with torch's
``DistributedSampler``: epoch ``e`` visits ``randperm(len(dataset))`` drawn from
``seed + e``, padded to a multiple of ``num_replicas``, and rank ``r`` takes
every ``num_replicas``-th index from ``r``. Nothing is drawn from the global
RNGs, so the order does not depend on what else ran (a validation, a resume).

Resuming mid-epoch needs the place in the epoch: :class:`ResumableSampler`'s
state is ``epoch`` + ``position`` (samples of this rank's share already
trained on), and it yields the epoch's order from ``position``. All shards
advance in lockstep, so the epoch's samples trained so far are always a prefix of
its permutation: ``start + position x num_replicas`` of them (:func:`epoch_samples`;
``start``: those trained before the run changed its number of shards). That makes
the resume *elastic*: on another number of shards the rest of the permutation,
``permutation[consumed:]`` padded anew to a multiple of the new number, is dealt
``rest[r::num_replicas]``, so the global sequence of samples goes on as it was
(:meth:`ResumableSampler.load_state_dict`). Training loaders make full batches only (``drop_last``): in every epoch a shard's last
``share % batch_size`` samples are not trained (a different set each epoch, as the order is
drawn anew); at the end of an epoch resumed in another layout they are the last of the
epoch's order (:func:`rest_trained` counts them for the warning, :func:`restore_data_order`
for the epoch's length). The position
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
(``use_distributed_sampler=False``, set in trainer/build.py).
"""

from __future__ import annotations

import math

import torch
from torch.utils.data import DataLoader, Sampler

from tuneup.errors import TuneupError


class ResumableSampler(Sampler[int]):
    """Indices of one rank's share of each epoch, from ``position`` on."""

    def __init__(
        self, size: int, seed: int = 0, shuffle: bool = True, rank: int = 0, num_replicas: int = 1
    ) -> None:
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank={rank} must be in [0, num_replicas={num_replicas})")
        self.size, self.seed, self.shuffle = size, seed, shuffle
        self.rank, self.num_replicas = rank, num_replicas
        self.epoch = 0
        self.start = 0  # the epoch's samples trained before this number of shards took over
        self.position = 0

    def __len__(self) -> int:
        """This rank's samples in a whole epoch (Lightning counts an epoch's batches from it)."""
        return math.ceil(self.size / self.num_replicas)

    def permutation(self, epoch: int) -> list[int]:
        """The whole epoch's order, before it is dealt to the shards."""
        if not self.shuffle:
            return list(range(self.size))
        generator = torch.Generator().manual_seed(self.seed + epoch)
        return torch.randperm(self.size, generator=generator).tolist()

    def order(self, epoch: int, start: int = 0) -> list[int]:
        """This rank's indices for ``epoch``, from the epoch's sample ``start`` (over all
        shards) on: the rest of the permutation, padded with its first indices to a multiple
        of ``num_replicas`` (padding only at the end, as DistributedSampler's), dealt out."""
        indices = self.permutation(epoch)
        rest = indices[start:]
        padding = -len(rest) % self.num_replicas
        rest += (indices * math.ceil(padding / max(1, self.size)))[:padding]
        return rest[self.rank :: self.num_replicas]

    def share(self) -> int:
        """This rank's samples in the current epoch from ``start`` (its whole length at 0)."""
        return math.ceil((self.size - self.start) / self.num_replicas)

    def __iter__(self):
        return iter(self.order(self.epoch, self.start)[self.position :])

    def set_epoch(self, epoch: int) -> None:
        """Lightning calls this at every epoch start; a new epoch starts at its beginning."""
        if epoch != self.epoch:
            self.epoch, self.start, self.position = epoch, 0, 0

    def advance(self, samples: int) -> None:
        self.position = min(self.share(), self.position + samples)

    def state_dict(self) -> dict:
        """Where the next sample comes from; a finished epoch is saved as the next one's start."""
        epoch, start, position = self.epoch, self.start, self.position
        if position >= self.share():
            epoch, start, position = epoch + 1, 0, 0
        return {
            "epoch": epoch,
            "start": start,
            "position": position,
            "seed": self.seed,
            "size": self.size,
            "num_replicas": self.num_replicas,
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue where ``state`` stopped; on another number of shards, the rest of its
        epoch is dealt anew (see the module's docstring). Other data mid-epoch is refused."""
        consumed = epoch_samples(state)
        if consumed and state["size"] != self.size:
            raise TuneupError(
                f"cannot resume mid-epoch: the checkpoint stopped {consumed} samples into "
                f"epoch {state['epoch']} of a dataset of {state['size']} samples; this run has "
                f"{self.size}. Resume with the same data, or from a checkpoint saved at an "
                "epoch end"
            )
        self.epoch, self.seed = state["epoch"], state["seed"]
        if state.get("num_replicas", 1) == self.num_replicas:
            self.start, self.position = int(state.get("start", 0)), int(state["position"])
        else:
            self.start, self.position = consumed, 0


def epoch_samples(state: dict) -> int:
    """The samples of a saved epoch already trained, over all shards: a prefix of its
    permutation (``position`` is one shard's; ``start`` those before a change of shards)."""
    position, shards = int(state["position"]), int(state.get("num_replicas") or 1)
    return int(state.get("start") or 0) + position * shards


def batches_left(
    size: int, consumed: int, shards: int, batch_size: int, drop_last: bool = True
) -> tuple[int, int]:
    """(micro-batches of a whole epoch, those left after ``consumed`` samples) for one shard:
    ``size`` samples dealt over ``shards`` in batches of ``batch_size``, the rest padded anew.
    ``drop_last`` (the training loaders'): a shard's last samples that do not fill a batch
    are not trained."""
    count = (lambda n: n // batch_size) if drop_last else (lambda n: math.ceil(n / batch_size))
    return count(math.ceil(size / shards)), count(math.ceil((size - consumed) / shards))


def rest_trained(
    size: int, consumed: int, shards: int, batch_size: int, drop_last: bool = True
) -> tuple[int, int, int]:
    """What the rest of an epoch, ``size - consumed`` samples dealt over ``shards`` in batches
    of ``batch_size``, trains: (samples of it trained once, the last ones of the epoch's order
    left out, padding samples trained again).

    Each shard takes ``rest[r::shards]`` and trains its first ``batches x batch_size``, so
    what is trained is the first ``shards x batches x batch_size`` of the padded rest: the
    samples left out are the last of the epoch's order, and the padding (the epoch's first
    samples, dealt again to fill the shards) is trained only when the shards' last batches
    are full."""
    rest = size - consumed
    _, batches = batches_left(size, consumed, shards, batch_size, drop_last)
    taken = shards * batches * batch_size
    return min(rest, taken), max(0, rest - taken), max(0, taken - rest)


def dropped_per_epoch(loader) -> int | None:
    """The training samples a whole epoch leaves out, over all shards: with full batches only,
    each shard's last ``share % batch_size`` (a different set each epoch: the order is drawn
    anew). None where ``loader`` is not tuneup's resumable one (a loader with its own sampler
    is used as it is)."""
    if not isinstance(loader, ResumableLoader):
        return None
    sampler = loader.sampler
    return rest_trained(sampler.size, 0, sampler.num_replicas, loader.batch_size, loader.drop_last)[
        1
    ]


def check_a_full_batch(sampler: ResumableSampler, batch_size: int) -> None:
    """Refuse an epoch without a full batch: a batch larger than each process's share of the
    training samples would train nothing, and the run would end "ok" after 0 steps."""
    share, shards = len(sampler), sampler.num_replicas
    if share >= batch_size:
        return
    samples = (
        f"{share} training samples of each of the {shards} processes ({sampler.size} in all)"
        if shards > 1
        else f"{share} training samples"
    )
    error = TuneupError(
        f"data.batch_size={batch_size} is larger than the {samples}: training batches are "
        f"full, so an epoch would train nothing; lower data.batch_size to {share} or less, or "
        "give more training samples"
    )
    error.tuneup_every_rank = True  # every process finds it: the command says it once
    raise error


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
        """The sampler's state and the batch size it was trained in."""
        return {**self.sampler.state_dict(), "batch_size": self.batch_size}

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


def data_group(trainer):
    """The process group of the data-parallel ranks, over which a training figure (the loss)
    is averaged: None (every process) under DDP; under tensor parallelism the mesh's
    ``data_parallel`` dimension, since the processes of a tensor-parallel group train the same
    samples and hold the same loss."""
    mesh = getattr(trainer.strategy, "_device_mesh", None)  # ModelParallelStrategy's, once set up
    names = getattr(mesh, "mesh_dim_names", None) or ()
    return mesh["data_parallel"].get_group() if "data_parallel" in names else None


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


def restore_data_order(trainer, state: dict | None) -> int | None:
    """Put the training loader where :func:`data_order` found it; call before its first batch.

    Returns the micro-batches left in the epoch when it goes on in another layout (another
    number of data shards or another batch size): Lightning counts the epoch's micro-batches
    in the old layout's (trainer/state/progress.py ``continue_epoch``). None otherwise."""
    loader = trainer.train_dataloader
    if state is None or not isinstance(loader, ResumableLoader):
        return None
    loader.load_state_dict(state)
    sampler, consumed = loader.sampler, epoch_samples(state)
    same_batch = state.get("batch_size", loader.batch_size) == loader.batch_size
    if not consumed or (sampler.num_replicas == state.get("num_replicas", 1) and same_batch):
        return None
    left = sampler.share() - sampler.position
    if loader.drop_last:  # a last batch that would not be full is not made (nor trained)
        return left // loader.batch_size
    return math.ceil(left / loader.batch_size)
