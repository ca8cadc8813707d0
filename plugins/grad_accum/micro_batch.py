"""Micro-batches inside the training step: ``grad_accum.micro_batch_size=N|auto``.

The DataLoader still yields ``data.batch_size`` samples per process, so the data order, the
sample counts and resume are untouched; the training step runs that batch as chunks of N
samples, each chunk's loss weighted by its share of the batch (chunk / batch, and 1/k under
``grad_accum.steps=k``, as Lightning divides), so the gradient is the whole batch's mean loss's
gradient. Lightning's backward is switched off for the run (``trainer.fit_loop._skip_backward``,
as Lightning's own StochasticWeightAveraging does) and :class:`MicroBatcher` does it chunk by
chunk; the optimizer step, the loss scaler's unscaling and step, clipping and the schedule
stay Lightning's.

- Backward: each chunk's through the strategy, as Lightning's own (the precision plugin's loss
  scaler scales it; ``on_before_backward``/``on_after_backward`` fire for each chunk, as for
  each micro-batch of ``grad_accum.steps``), with autocast off (torch: backward passes under
  autocast are not recommended).
- DDP: the chunks before the last accumulate locally (inside DDP's forward, before its
  reducer is prepared: no all-reduce), the last one's backward all-reduces, prepared as
  Lightning's manual optimization prepares it (``prepare_for_backward``).
- FSDP2: every chunk's backward reduce-scatters into the sharded gradients (keeping an
  unsharded gradient across chunks would cost the memory micro-batching saves); inside an
  accumulation window the strategy's ``set_requires_gradient_sync(False)`` holds for all.

Hand-made because Lightning has none inside a step: its ``accumulate_grad_batches`` takes
DataLoader batches as micro-batches, so a smaller one would change the data order, the sample
counts and the resume position, and a failed step could not be run again.

``auto``: the first step tries the whole batch; an out-of-memory error in a chunk's forward
halves the chunk and the step goes on from the failed chunk (what ran before it stands); one
in a backward zeroes the gradients and redoes the batch, allowed where they hold nothing else
(the first micro-batch of an accumulation window). Under several processes a MAX all-reduce
of a failure flag after each attempt makes every rank halve together (Composer's
``device_train_microbatch_size="auto"`` does the same); under DDP it comes before the last
chunk's all-reducing backward, whose own out-of-memory error cannot be retried.
"""

from __future__ import annotations

import logging
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch

from tuneup import TuneupError
from tuneup.trainer.module import TrainingModule

log = logging.getLogger(__name__)


def batch_length(batch) -> int | None:
    """The samples in ``batch``: the first tensor's leading size (tuples, lists, dicts)."""
    if isinstance(batch, torch.Tensor):
        return batch.shape[0] if batch.dim() else None
    if isinstance(batch, (dict, tuple, list)):
        for item in batch.values() if isinstance(batch, dict) else batch:
            found = batch_length(item)
            if found is not None:
                return found
    return None


def split(batch, start: int, stop: int):
    """Samples ``start:stop`` of every tensor in ``batch`` (non-tensors kept as they are)."""
    if isinstance(batch, torch.Tensor):
        return batch[start:stop] if batch.dim() else batch
    if isinstance(batch, dict):
        return type(batch)((k, split(v, start, stop)) for k, v in batch.items())
    if isinstance(batch, (tuple, list)):
        parts = [split(v, start, stop) for v in batch]
        return type(batch)(*parts) if hasattr(batch, "_fields") else type(batch)(parts)
    return batch


def loss_of(output):
    """The loss a training step returned (a tensor, or a dict's ``"loss"``)."""
    return output["loss"] if isinstance(output, dict) else output


@dataclass
class Progress:
    """How far one batch has got."""

    start: int = 0  # the samples before it are done: forward and backward
    losses: list = field(default_factory=list)  # each done chunk's loss x its share
    last: tuple | None = None  # the last chunk's (output, weighted loss): the batch is done
    # (under DDP the last chunk's backward, the one that all-reduces, comes after)


class MicroBatcher:
    """Runs a LightningModule's training step in chunks of ``size`` samples (None: the whole
    batch); ``auto``: halves ``size`` on out-of-memory errors, agreed across processes."""

    def __init__(self, size: int | None, auto: bool) -> None:
        self.size, self.auto = size, auto
        self.retries = 0  # out-of-memory halvings over the run (the same on every process)
        self.ddp = None  # the DistributedDataParallel wrapper, under strategy=ddp
        self.resync = False  # DDP's gradient sync to switch back on after its forward
        self.in_backward = False  # where an out-of-memory error struck

    def install(self, trainer, module) -> None:
        """Take over the module's backward, wrapping its ``training_step`` on the instance.
        Lightning's zero_grad goes with its backward: :meth:`step` calls the module's
        ``optimizer_zero_grad`` (not ``on_before_zero_grad``)."""
        own = module.training_step
        trainer.fit_loop._skip_backward = True  # the chunks' backward is done here

        def training_step(batch, batch_idx, *args, **kwargs):
            def chunk_step(chunk):
                return own(chunk, batch_idx, *args, **kwargs)

            return self.step(trainer, module, chunk_step, batch, batch_idx)

        module.training_step = training_step
        if isinstance(module, TrainingModule):
            module.logs_each_batch = False  # step() logs the batch's loss, not each chunk's
        ddp = trainer.strategy.model
        if isinstance(ddp, torch.nn.parallel.DistributedDataParallel):
            self.ddp = ddp
            ddp.register_forward_hook(self._after_ddp_forward)

    def _after_ddp_forward(self, *_) -> None:
        """DDP's forward has passed where it would prepare its reducer again: sync again
        (as Lightning's manual optimization switches it back after the outer forward)."""
        if self.resync:
            self.ddp.require_backward_grad_sync = self.ddp.require_forward_param_sync = True
            self.resync = False

    def step(self, trainer, module, chunk_step, batch, batch_idx):
        """The training step of ``batch``: the loss of the whole batch (detached: the
        gradients are in place already), in the step's output."""
        total = batch_length(batch)
        if total is None:
            raise TuneupError(
                "grad_accum.micro_batch_size needs batches holding tensors with the samples "
                f"along the first dimension; this one is a {type(batch).__name__}"
            )
        if batch_idx % trainer.accumulate_grad_batches == 0:  # a window's first micro-batch
            for optimizer in trainer.optimizers:
                module.optimizer_zero_grad(trainer.current_epoch, batch_idx, optimizer)
        # Under DDP the chunks run inside its forward, before it prepares its reducer: their
        # backward accumulates locally, as under no_sync.
        sync = self.ddp is not None and self.ddp.require_backward_grad_sync
        progress = Progress()
        while self._agree(
            trainer, self._attempt(trainer, module, chunk_step, batch, total, progress, batch_idx)
        ):
            self._shrink(total, trainer)
        output, loss = progress.last
        if self.ddp is not None:
            if sync:
                from pytorch_lightning.overrides.distributed import prepare_for_backward

                prepare_for_backward(self.ddp, loss)
                self.ddp.require_backward_grad_sync, self.resync = False, True
            try:
                self._backward(trainer, loss)
            except torch.OutOfMemoryError as exc:
                if not self.auto:
                    raise
                raise TuneupError(
                    "grad_accum.micro_batch_size=auto: out of memory in the backward that "
                    "all-reduces the gradients (DDP's, on the last micro-batch), which cannot "
                    f"be retried: set grad_accum.micro_batch_size={self._half(total)}"
                ) from exc
        loss = torch.stack(progress.losses).sum()
        if isinstance(module, TrainingModule):
            module.log_loss(loss)  # the batch's, over the last chunk's (as it logs)
        return {**output, "loss": loss} if isinstance(output, dict) else loss

    def _attempt(self, trainer, module, chunk_step, batch, total, progress, batch_idx) -> bool:
        """Run the chunks from ``progress.start``; True when one ran out of memory."""
        if progress.last is not None:
            return False  # done; the other processes are not
        size = min(self.size or total, total)
        k = trainer.accumulate_grad_batches
        try:
            while progress.start < total:
                stop = min(progress.start + size, total)
                output = chunk_step(split(batch, progress.start, stop))
                loss = loss_of(output) * ((stop - progress.start) / total / k)
                if stop < total or self.ddp is None:
                    self._backward(trainer, loss)
                progress.losses.append(loss.detach() * k)
                progress.start = stop
            progress.last = (output, loss)
            return False
        except torch.OutOfMemoryError:
            if not self.auto:
                raise
        self._recover(trainer, module, progress, batch_idx)  # out of the except: frees its frames
        return True

    def _backward(self, trainer, loss) -> None:
        device = loss.device.type
        quiet = (
            torch.autocast(device, enabled=False)
            if torch.is_autocast_enabled(device)
            else nullcontext()
        )
        self.in_backward = True
        with quiet:
            trainer.strategy.backward(loss, None)
        self.in_backward = False

    def _recover(self, trainer, module, progress, batch_idx) -> None:
        """After an out-of-memory error: free its memory; a backward's partial gradients are
        zeroed and the batch redone, where they hold no earlier micro-batch's."""
        if self.in_backward:
            self.in_backward = False
            if batch_idx % trainer.accumulate_grad_batches:
                raise TuneupError(
                    "grad_accum.micro_batch_size=auto: out of memory in a backward after the "
                    "first micro-batch of an accumulation window, whose gradients cannot be "
                    f"taken back: set grad_accum.micro_batch_size={self._half(progress.start)}"
                )
            module.zero_grad(set_to_none=True)
            progress.start, progress.losses = 0, []
        from torch.distributed.fsdp import FSDPModule

        for m in module.modules():  # FSDP2 left mid-way: parameters back to their shards
            if isinstance(m, FSDPModule):
                m.reshard()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def _agree(self, trainer, failed: bool) -> bool:
        """Whether any process ran out of memory in this attempt (auto, several processes:
        a MAX all-reduce of the flag; one process: its own)."""
        if not self.auto or trainer.world_size == 1:
            return failed
        flag = torch.tensor(int(failed), device=trainer.strategy.root_device)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        return bool(flag.item())

    def _half(self, total: int) -> int:
        return max(1, min(self.size or total, total) // 2)

    def _shrink(self, total: int, trainer) -> None:
        size = min(self.size or total, total)
        if size == 1:
            raise TuneupError(
                "grad_accum.micro_batch_size=auto: out of memory with micro-batches of 1 "
                f"sample (rank {trainer.global_rank}): the model does not fit in memory for "
                "training; shard it (strategy=fsdp), or lower its memory "
                "(activation_checkpointing=blocks, precision=bf16)"
            )
        self.size = size // 2
        self.retries += 1
        if trainer.global_rank == 0:
            log.info(
                "grad_accum.micro_batch_size=auto: out of memory with %d samples a "
                "micro-batch; now %d",
                size,
                self.size,
            )
