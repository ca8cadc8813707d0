"""Stop a run whose loss became NaN or infinite, naming the step, without a device sync per step.

In a single CPU process the loss is checked as soon as it is computed:
reading a CPU scalar waits for nothing. On CUDA, reading it would drain the
GPU queue every step, so :class:`LossWatch` compares on the device and keeps
the index of the first non-finite micro-batch in a device tensor
(``torch.where``, asynchronous); the host remembers which (step, epoch, batch)
each index was. The tensor is read (one sync) by :meth:`LossWatch.check` at the
logging interval, when Lightning reads the logged loss anyway, and before every
checkpoint is written, so a diverged run never overwrites the last good
checkpoint: the save fails first. With several processes the check is deferred
the same way and its answer is agreed between ranks (any rank's NaN stops all
of them at the same point), so no rank is left waiting in a collective for one
that stopped alone.
"""

from __future__ import annotations

import torch

from tuneup import TuneupError


class Diverged(TuneupError):
    """The loss (or a weight about to be saved) is NaN or infinite."""


class LossWatch:
    def __init__(self) -> None:
        self.first_bad: torch.Tensor | None = None  # device: index into self.where, -1: none
        self.bad_value: torch.Tensor | None = None
        self.where: list[tuple[int, int, int]] = []  # (step, epoch, batch) since the last check
        self.rank = 0

    def observe(self, loss: torch.Tensor, step: int, epoch: int, batch: int, rank: int,
                deferred: bool = False) -> None:  # fmt: skip
        """Note the loss of one micro-batch of optimizer step ``step`` (1-based)."""
        loss = loss.detach()
        if not deferred:
            if not torch.isfinite(loss):
                raise Diverged(message(float(loss), (step, epoch, batch), rank))
            return
        if self.first_bad is None:
            self.first_bad = torch.full((), -1, dtype=torch.long, device=loss.device)
            self.bad_value = torch.zeros((), dtype=loss.dtype, device=loss.device)
        new = ~torch.isfinite(loss) & (self.first_bad < 0)
        self.first_bad = torch.where(new, len(self.where), self.first_bad)
        self.bad_value = torch.where(new, loss, self.bad_value)
        self.where.append((step, epoch, batch))
        self.rank = rank

    def check(self, any_rank=lambda bad: bad) -> None:
        """Raise :class:`Diverged` if a loss since the last check was not finite (one sync on CUDA).

        ``any_rank(bad) -> bool`` agrees the answer between processes; call it on all ranks at once.
        """
        index = -1 if self.first_bad is None else int(self.first_bad)
        if any_rank(index >= 0):
            if index < 0:
                raise Diverged("training diverged: the loss was NaN or inf on another rank")
            raise Diverged(message(float(self.bad_value), self.where[index], self.rank))
        self.first_bad = self.bad_value = None
        self.where.clear()


def message(value: float, where: tuple[int, int, int], rank: int) -> str:
    step, epoch, batch = where
    return (
        f"training diverged: the loss was {value} in step {step} (epoch {epoch}, batch {batch} "
        f"of the epoch) on rank {rank}. Checkpoints written before it are kept. Lower the "
        "learning rate, add warm-up (scheduler.warmup_steps) or gradient clipping "
        "(+trainer.gradient_clip_val=1.0), or use bf16 instead of fp16"
    )


def nonfinite_tensors(state_dict: dict) -> list[str]:
    """Names of floating-point tensors in ``state_dict`` holding NaN or inf (one sync in all)."""
    floats = [(k, t) for k, t in state_dict.items() if torch.is_tensor(t) and t.is_floating_point()]
    if not floats:
        return []
    finite = torch.stack([torch.isfinite(t).all() for _, t in floats])
    if bool(finite.all()):
        return []
    return [k for (k, _), ok in zip(floats, finite.tolist(), strict=True) if not ok]
