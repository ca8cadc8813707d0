"""Per-step overhead over bare Lightning, counted in Python calls and in torch ops
(bench/overhead.py --calls): unlike a step's time, the counts do not depend on the machine's load, so a regression in
tuneup's per-step work fails here on any machine."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import bench_module
from tuneup.plugins.measure.loss_curve import FLUSH, LossCurve

#: tuneup's Python calls a step beyond bare Lightning's outside logging steps, at most: -40
#: measured on the MLP (fewer than Lightning: TrainingModule's no-op hooks are not dispatched),
#: +350 before the per-step hooks that do nothing were skipped (issue 32). A logging step adds
#: Lightning's ``self.log`` of the loss and the gradient norm, ~1,900 calls each: ~230 a step
#: at the default interval of 20 (bench/overhead.py --calls).
EXTRA_CALLS_A_STEP = 50

#: tuneup's torch ops a step beyond bare Lightning's outside logging steps, at most: 8 measured
#: on this short run (the loss check's one read, the measure plugin's detach, the loss curve's
#: bucket sums), 12 when the loss check was ``torch.isfinite`` (four kernels, 36 us a step).
EXTRA_OPS_A_STEP = 9


#: (what is counted, bench/overhead.py's function, the least bare Lightning makes a step (the
#: count saw its steps), the most tuneup may add)
COUNTS = {
    "python calls": ("tuneup_extra_calls", 1000, EXTRA_CALLS_A_STEP),
    "torch ops": ("tuneup_extra_ops", 100, EXTRA_OPS_A_STEP),
}


@pytest.mark.parametrize("counted", COUNTS)
def test_tuneup_adds_few_calls_and_ops_a_step_to_bare_lightning(counted):
    function, least, most = COUNTS[counted]
    overhead = bench_module("overhead")
    more = ("data.train_samples=512", "data.val_samples=32", "trainer.log_every_n_steps=1000")
    cfg = overhead.config("mlp", steps=16, batch_size=32, more=more)
    bare, ours, extra = getattr(overhead, function)(cfg, warmup=6)
    top = sorted(extra.items(), key=lambda kv: -kv[1])[:8]
    assert bare > least
    assert ours - bare <= most, f"{ours:.1f} {counted} a step vs {bare:.1f}: {top}"


def test_the_loss_curve_sums_losses_kept_by_reference_across_flushes():
    curve = LossCurve(2)  # buckets of 1, then 2, 4 ... micro-batches: one of 128 at the end
    losses = [float(i % 7) for i in range(2 * FLUSH + 3)]
    for loss in losses:
        curve.add(torch.tensor(loss), 1)
    values = curve.values()
    assert values["samples"] == [128, 2 * FLUSH + 3]
    assert values["loss"] == pytest.approx([sum(losses[:128]) / 128, sum(losses[128:]) / 3])
