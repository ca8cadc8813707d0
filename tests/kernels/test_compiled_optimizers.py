"""LAMB and LARS steps under torch.compile, on their reference path (CPU).

A user may compile the optimizer step (and bench/kernels.py does). A step that set an attribute
of the optimizer broke that: torch 2.11 refused to compile it, torch 2.13 dropped the attribute,
so the summary's ``optimizer.implementation`` read None. The fused path is covered on a GPU
(tests/gpu/test_kernels_gpu.py).
"""

import pytest
import torch

from tuneup.plugins.kernels import Lamb, Lars, ran


@pytest.mark.parametrize("optimizer_class", [Lamb, Lars])
def test_compiled_step_is_one_graph_with_the_eager_weights(oracles, optimizer_class):
    torch._dynamo.reset()
    weights, grads = oracles.random_problem(steps=3)
    eager, _ = oracles.run_optimizer(optimizer_class, weights, grads)

    def compiled(params):
        optimizer = optimizer_class(params)
        # aot_eager: Dynamo and AOTAutograd, where an optimizer step breaks, without C++ builds
        optimizer.step = torch.compile(optimizer.step, backend="aot_eager", fullgraph=True)
        return optimizer

    ran.clear()
    got, optimizer = oracles.run_optimizer(compiled, weights, grads)
    for g, w in zip(got, eager, strict=True):
        torch.testing.assert_close(g, w, atol=1e-6, rtol=1e-6)
    assert optimizer.implementation == "reference"
    assert ran == {optimizer_class.OP_NAME: {"reference"}}
