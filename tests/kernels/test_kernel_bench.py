"""bench/kernels.py on CPU: its torch._foreach baselines and its parameter sets. Its ``--smoke``
run, every row it prints on a GPU, is test_interpreted_bench.py (under Triton's interpreter)."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import bench_module
from tuneup.plugins.kernels import Lamb, Lars


@pytest.mark.parametrize(("optimizer_class", "hyper"), [
    (Lamb, dict(lr=0.02, weight_decay=0.1, trust_clip=0.5)),
    (Lars, dict(lr=0.5, weight_decay=1e-3)),
])  # fmt: skip
def test_foreach_baseline_steps_like_the_reference(optimizer_class, hyper):
    """The torch._foreach row times the same update as the eager loop, or it compares nothing."""
    foreach_class = bench_module("kernels_optim").foreach_version(optimizer_class)
    torch.manual_seed(0)
    weights = [torch.randn(s) for s in [(8, 4), (4,), (3, 8), (0,)]]
    runs = []
    for make in (optimizer_class, foreach_class):
        params = [w.clone().requires_grad_() for w in weights]
        optimizer = make(params, **hyper)
        for step in range(3):
            for i, param in enumerate(params):
                param.grad = torch.full_like(param, 0.1 * (step + 1)) + torch.arange(
                    param.numel(), dtype=param.dtype
                ).reshape(param.shape) / 10 * (i + 1)
            optimizer.step()
        runs.append(params)
    for reference, foreach in zip(*runs, strict=True):
        torch.testing.assert_close(foreach, reference, atol=1e-6, rtol=1e-6)
    assert all(not torch.equal(p, w) for p, w in zip(runs[0][:3], weights, strict=False))


def test_bert_large_parameter_set_has_334m_values():
    shapes = bench_module("kernels_optim").bert_shapes(1024, 24, 30522)
    assert round(sum(torch.Size(s).numel() for s in shapes) / 1e6) == 334
