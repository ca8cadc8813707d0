"""Stop a run whose loss became NaN or infinite, naming the step, without a device sync per step.

In a single CPU process the loss is checked as soon as it is computed:
reading a CPU scalar waits for nothing. On CUDA, reading it would drain the
GPU queue every step, so :class:`LossWatch` keeps the losses as device
scalars (no kernel, no sync) and the host remembers which (step, epoch, batch)
each one was. They are compared and read (one sync) by :meth:`LossWatch.check` at the
logging interval, when Lightning reads the logged loss anyway, and before every
checkpoint is written, so a diverged run never overwrites the last good
checkpoint: the save fails first. With several processes the check is deferred
the same way and its answer is agreed between ranks (any rank's NaN stops all
of them at the same point), so no rank is left waiting in a collective for one
that stopped alone.

A non-finite loss is not always the training's fault: a NaN or inf in the batch itself
(the data) makes the loss NaN whatever the learning rate. So the batch is looked at too:
on the immediate path once the loss is bad (which floating-point parts hold how many
non-finite values), on the deferred path as one device flag per floating-point part of
each micro-batch (``isfinite(..).all()``, no sync). The error then says it was the data,
and gives no learning-rate or fp16 advice.
"""

from __future__ import annotations

import math

import torch

from tuneup.errors import TuneupError


class Diverged(TuneupError):
    """The loss (or a weight about to be saved) is NaN or infinite."""


class LossWatch:
    """The deferred path keeps each micro-batch's loss (a detached device scalar: no kernel)
    and, per floating-point part of its data, one ``isfinite(..).all()`` flag; the check
    stacks them and reads the answer in one sync. Comparing on the device at every step
    instead took ~10 small kernels a step (56 us on CPU, as many launches on CUDA)."""

    def __init__(self) -> None:
        self.losses: list[torch.Tensor] = []  # device scalars since the last check
        self.data_ok: list[list[torch.Tensor]] = []  # per loss: its data's parts all finite
        self.where: list[tuple[int, int, int]] = []  # (step, epoch, batch) since the last check
        self.rank = 0

    def observe(
        self,
        loss: torch.Tensor,
        step: int,
        epoch: int,
        batch: int,
        rank: int,
        deferred: bool = False,
        data=None,
    ) -> None:
        """Note the loss of one micro-batch of optimizer step ``step`` (1-based); ``data``: the
        micro-batch itself, looked at for NaN/inf when the loss is not finite."""
        if not deferred:  # a CPU scalar: one read and no kernel (torch.isfinite is four, 36 us)
            value = loss.item()
            if not math.isfinite(value):
                bad = nonfinite_parts(data)
                raise Diverged(message(value, (step, epoch, batch), rank, bad))
            return
        loss = loss.detach()
        self.losses.append(loss)
        self.data_ok.append([torch.isfinite(t.detach()).all() for _, t in floating_parts(data)])
        self.where.append((step, epoch, batch))
        self.rank = rank

    def check(self, any_rank=lambda bad: bad) -> None:
        """Raise :class:`Diverged` if a loss since the last check was not finite (one sync on CUDA).

        ``any_rank(bad) -> bool`` agrees the answer between processes; call it on all ranks at once.
        """
        index = first_nonfinite(self.losses)
        if any_rank(index >= 0):
            if index < 0:
                raise Diverged("training diverged: the loss was NaN or inf on another rank")
            ok = self.data_ok[index]
            bad = not bool(torch.stack([f.to(ok[0].device) for f in ok]).all()) if ok else False
            value = float(self.losses[index])  # which part is not known here, only that one was
            raise Diverged(message(value, self.where[index], self.rank, bad))
        self.losses.clear()
        self.data_ok.clear()
        self.where.clear()


def first_nonfinite(losses: list[torch.Tensor]) -> int:
    """The index of the first NaN/inf among ``losses`` (scalars on one device), -1: none; one
    read (a sync on CUDA)."""
    if not losses:
        return -1
    finite = torch.isfinite(torch.stack([x.float() for x in losses]))
    found = torch.stack([(~finite).any(), (~finite).to(torch.int8).argmax()]).tolist()
    return found[1] if found[0] else -1


def message(
    value: float, where: tuple[int, int, int], rank: int, bad_data: list[str] | bool = False
) -> str:
    """The error for a non-finite loss; ``bad_data``: the parts of the micro-batch that held
    NaN or inf (:func:`nonfinite_parts`), or True when it did and which is not known."""
    step, epoch, batch = where
    at = f"in step {step} (epoch {epoch}, batch {batch} of the epoch) on rank {rank}"
    if bad_data:
        parts = f" in {', '.join(bad_data)}" if isinstance(bad_data, list) else ""
        return (
            f"the data holds NaN or inf: the loss was {value} {at}, and that batch held "
            f"non-finite values{parts}. The training did not diverge; "
            "checkpoints written before it are kept. Clean the data set, or drop or repair "
            "such samples in your data's loading or transform"
        )
    return (
        f"training diverged: the loss was {value} {at}. Checkpoints written before it are "
        "kept. Lower the learning rate, add warm-up (scheduler.warmup_steps) or gradient "
        "clipping (optimizer.clip_grad_norm=1.0), or use bf16 instead of fp16"
    )


def floating_parts(data, name: str = "batch"):
    """(name, tensor) of each floating-point tensor in a batch (nested tuples, lists, dicts,
    or an object with tensor attributes such as a transformers BatchEncoding)."""
    if isinstance(data, torch.Tensor):
        if data.is_floating_point() or data.is_complex():
            yield name, data
    elif isinstance(data, dict) or hasattr(data, "items"):
        for key, value in data.items():
            yield from floating_parts(value, f"{name}[{key!r}]")
    elif isinstance(data, (list, tuple)):
        for i, value in enumerate(data):
            yield from floating_parts(value, f"{name}[{i}]")


def nonfinite_parts(data) -> list[str]:
    """``batch[0] (12 of 3072 values)`` for each floating-point part of ``data`` that holds NaN
    or inf (reads them: for after the loss went bad)."""
    found = []
    for name, tensor in floating_parts(data):
        count = int((~torch.isfinite(tensor.detach())).sum())
        if count:
            found.append(f"{name} ({count} of {tensor.numel()} values)")
    return found


def nonfinite_tensors(state_dict: dict, device: torch.device | None = None) -> list[str]:
    """Names of floating-point tensors in ``state_dict`` holding NaN or inf (one sync in all).

    A sharded tensor (DTensor, under strategy=fsdp) is judged by this process's shard; the
    processes then agree (one all-reduce on ``device``, the strategy's root device: NCCL
    reduces CUDA tensors only, and Lightning's sharded state dict is offloaded to the CPU), so a
    bad shard anywhere is named everywhere."""
    floats = [(k, t) for k, t in state_dict.items() if torch.is_tensor(t) and t.is_floating_point()]
    sharded = any(hasattr(t, "to_local") for _, t in floats)
    local = [(k, t.to_local() if hasattr(t, "to_local") else t) for k, t in floats]
    if not local:
        return []
    finite = torch.stack([torch.isfinite(t).all() for _, t in local])
    if sharded and torch.distributed.is_initialized():
        finite = finite.to(device=device, dtype=torch.int32)
        torch.distributed.all_reduce(finite, op=torch.distributed.ReduceOp.MIN)
    if bool(finite.all()):
        return []
    return [k for (k, _), ok in zip(local, finite.tolist(), strict=True) if not ok]
