"""The summary's figures made from what the measure plugin (plugins/measure/) recorded.

Plain functions on plain lists: speed windows, step-time percentiles, validation metrics by
short name, a batch's sample count, and the rounding the summary uses. No state.
"""

from __future__ import annotations

import math
import statistics
from itertools import pairwise

from tuneup.trainer.batches import first_tensor


def speed_windows(intervals_ms: list[float], sizes: list[int], count: int, world: int = 1):
    """samples/s of ``count`` consecutive windows of the measured steps (fewer if fewer steps)."""
    n = min(len(intervals_ms), len(sizes))
    if not n:
        return []
    k = min(count, n)
    bounds = [round(i * n / k) for i in range(k + 1)]
    return [
        rounded(sum(sizes[a:b]) * world / (sum(intervals_ms[a:b]) / 1e3))
        for a, b in pairwise(bounds)
        if sum(intervals_ms[a:b]) > 0
    ]


def rounded(value: float) -> float:
    """Six significant digits: the summary stays readable, nothing measured is lost."""
    return float(f"{value:.6g}") if math.isfinite(value) else value


def batch_size(batch) -> int:
    """Samples in a batch: the length of its first tensor (a tuple, list or dict batch)."""
    first = first_tensor(batch)
    return first.shape[0] if first is not None and first.dim() else 0


def validation_metrics(metrics: dict) -> dict[str, float]:
    """The logged validation metrics by short name: ``val/acc`` (tuneup's) or ``val_acc``,
    ``val_loss`` (a user's LightningModule) -> ``acc``, ``loss``."""
    found = {}
    for key, value in metrics.items():
        for prefix in ("val/", "val_"):
            if key.startswith(prefix) and getattr(value, "numel", lambda: 1)() == 1:
                found[key[len(prefix) :]] = float(value)
    return found


def percentiles(values: list[float]) -> dict:
    if len(values) < 2:
        value = values[0] if values else None
        return {"p50": value, "p90": value, "count": len(values)}
    deciles = statistics.quantiles(values, n=10)
    return {"p50": statistics.median(values), "p90": deciles[8], "count": len(values)}
