"""loss_curve: the mean training loss over buckets of micro-batches, summed on the loss's device.

Kept apart from the plugin (plugins/measure/) as one data structure with its own rule
(buckets merge in pairs), read once at the report.
"""

from __future__ import annotations

import torch

from tuneup.plugins.measure.figures import rounded

#: Losses kept by reference at most before they are summed into their bucket.
FLUSH = 64


class LossCurve:
    """The mean training loss over buckets of consecutive micro-batches, kept on the loss's device.

    Each micro-batch's loss tensor is kept by reference; every :data:`FLUSH` of them, and when
    a bucket is full, they are summed into their bucket on the device (a stack and a sum, no
    read-back), so a step adds no kernel of its own. When ``points`` buckets are full,
    neighbours merge and every bucket holds twice as many micro-batches: a run of any length
    keeps between points/2 and points points. The sums are read once, in :meth:`values`.
    """

    def __init__(self, points: int) -> None:
        self.points = points + points % 2  # even, so buckets merge in pairs
        self.sums = None  # tensor [points] on the loss's device
        self.pending: list = []  # losses of the last bucket not yet in self.sums
        self.counts: list[int] = []  # micro-batches per bucket
        self.samples: list[int] = []  # samples per bucket (this process)
        self.per_bucket = 1

    def add(self, loss, samples: int) -> None:
        if not self.counts or self.counts[-1] == self.per_bucket:
            self._flush()
            if len(self.counts) == self.points:
                self._merge()  # every merged bucket is full: a new one follows
            self.counts.append(0)
            self.samples.append(0)
        self.pending.append(loss)
        self.counts[-1] += 1
        self.samples[-1] += samples
        if len(self.pending) == FLUSH:
            self._flush()

    def _flush(self) -> None:
        """Sum the pending losses into the last bucket, on their device: no sync."""
        if not self.pending:
            return
        if self.sums is None:
            device = self.pending[0].device
            self.sums = torch.zeros(self.points, dtype=torch.float32, device=device)
        total = torch.stack(self.pending).sum(dtype=torch.float32)
        self.sums[len(self.counts) - 1] += total
        self.pending.clear()

    def flushed(self):
        """The buckets' sums so far (a tensor on the loss's device; None before any loss)."""
        self._flush()
        return self.sums

    def _merge(self) -> None:
        half = self.points // 2
        self.sums = torch.cat([self.sums.view(half, 2).sum(1), self.sums.new_zeros(half)])
        self.counts = [a + b for a, b in zip(self.counts[::2], self.counts[1::2], strict=True)]
        self.samples = [a + b for a, b in zip(self.samples[::2], self.samples[1::2], strict=True)]
        self.per_bucket *= 2

    def values(self, world: int = 1, start: int = 0) -> dict | None:
        """``{"samples": [seen at each bucket's end], "loss": [bucket means]}``, or None;
        ``start``: samples seen before the first bucket (by earlier sessions of a resumed run)."""
        self._flush()
        if self.sums is None:
            return None
        sums = self.sums[: len(self.counts)].tolist()  # the one read of the device
        seen, total = [], start
        for samples in self.samples:
            total += samples * world
            seen.append(total)
        losses = [rounded(s / c) for s, c in zip(sums, self.counts, strict=True)]
        return {"samples": seen, "loss": losses}
