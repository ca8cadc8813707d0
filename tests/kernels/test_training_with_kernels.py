"""Short training runs through the kernel ops' reference path match plain PyTorch runs."""

import pytest
import torch

from tuneup.plugins.kernels import Lamb, Lars


@pytest.mark.parametrize(
    ("loss_name", "make_optimizer"),
    [
        ("linear_cross_entropy", lambda p: Lamb(p, lr=0.01)),
        ("cross_entropy", lambda p: Lars(p, lr=0.5, trust_coefficient=0.02)),
    ],
)
def test_losses_match_the_unfused_run(oracles, loss_name, make_optimizer):
    fused = oracles.training_losses(loss_name, make_optimizer)
    unfused = oracles.training_losses(loss_name, make_optimizer, fused_ops=False)
    torch.testing.assert_close(fused, unfused, atol=1e-5, rtol=0)
    assert fused[-1] < fused[0] - 0.1  # it did train
