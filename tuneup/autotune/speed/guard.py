"""The accuracy guard: a candidate whose loss curve leaves the baseline's is rejected.

Every trial trains the same data in the same order from the same seed for the same steps
(the trial settings, tuneup/autotune/trials.py), so a feature that only changes speed
(a memory layout, a loader, cudnn autotuning) reproduces the baseline's curve to rounding,
while one that changes the arithmetic (a half type, a kernel, a batch size) moves it. The
curves are summary.json's ``loss_curve``: mean training loss over buckets of micro-batches,
placed at the middle of each bucket in samples seen, so runs of different batch sizes are
compared at equal samples seen (the baseline's curve interpolated linearly).

The gap is the largest relative difference over the points both curves cover:
``max |loss - baseline loss| / baseline loss``; above ``autotune.loss_tolerance`` the
candidate is rejected with the gap and where it was largest. A loss that is not finite is
always rejected.
"""

from __future__ import annotations

import math
from bisect import bisect_left


def midpoints(curve: dict) -> list[tuple[float, float]]:
    """(samples seen at the middle of each bucket, its mean loss)."""
    points, before = [], 0
    for seen, loss in zip(curve["samples"], curve["loss"], strict=True):
        points.append(((before + seen) / 2, loss))
        before = seen
    return points


def loss_gap(baseline: dict, candidate: dict) -> tuple[float, float | None]:
    """(the largest relative gap, the samples seen where it is); inf for a loss that is not
    finite, (0.0, None) where the curves share no stretch."""
    base = midpoints(baseline)
    xs = [x for x, _ in base]
    worst, where = 0.0, None
    for x, loss in midpoints(candidate):
        if not math.isfinite(loss):
            return math.inf, x
        if not xs or x < xs[0] or x > xs[-1]:
            continue
        reference = _interpolate(base, xs, x)
        gap = abs(loss - reference) / abs(reference) if reference else abs(loss)
        if gap > worst:
            worst, where = gap, x
    return worst, where


def rejection(baseline: dict | None, candidate: dict | None, tolerance: float) -> str | None:
    """Why the guard rejects the candidate's curve, or None when it passes."""
    if not candidate:
        return "no loss curve in its summary.json"
    if not baseline:
        return None  # nothing to compare with (the baseline's run had no loss curve)
    gap, where = loss_gap(baseline, candidate)
    if gap <= tolerance:
        return None
    if math.isinf(gap):
        return f"its training loss is not finite (at {where:.0f} samples)"
    return (
        f"its loss curve leaves the baseline's by {gap * 100:.3g}% at {where:.0f} samples seen "
        f"(autotune.loss_tolerance={tolerance:g})"
    )


def _interpolate(points: list[tuple[float, float]], xs: list[float], x: float) -> float:
    i = bisect_left(xs, x)
    if xs[i] == x or i == 0:
        return points[i][1]
    (x0, y0), (x1, y1) = points[i - 1], points[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
