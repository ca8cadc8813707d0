"""Lars on its reference path against the published update rule, and its AMP protocol."""

import pytest
import torch

from tuneup.plugins.kernels import Lars

HYPER = dict(lr=0.1, momentum=0.9, weight_decay=0.01, trust_coefficient=0.05, eps=1e-8)


def paper_hyper():
    hyper = dict(HYPER)
    hyper["eta"] = hyper.pop("trust_coefficient")
    return hyper


@pytest.mark.parametrize("exclude", [True, False])
def test_seven_steps_match_the_paper(oracles, exclude):
    weights, grads = oracles.random_problem()
    make = lambda p: Lars(p, **HYPER, exclude_norms_and_biases=exclude)  # noqa: E731
    got, optimizer = oracles.run_optimizer(make, weights, grads)
    excluded = [exclude and w.ndim <= 1 for w in weights]
    want = oracles.paper_lars(weights, grads, **paper_hyper(), excluded=excluded)
    for g, w, w0 in zip(got, want, weights, strict=True):
        torch.testing.assert_close(g.double(), w, atol=1e-6, rtol=0)
        assert (g - w0).abs().max() > 1e-3  # the steps did move the weights
    assert optimizer.implementation == "reference"


def test_grad_scale_unscales_and_found_inf_skips_the_step(oracles):
    weights, grads = oracles.random_problem(steps=2)
    plain, _ = oracles.run_optimizer(lambda p: Lars(p, **HYPER), weights, grads)

    def scaled(params):
        optimizer = Lars(params, **HYPER)
        optimizer.grad_scale = torch.tensor(512.0)
        optimizer.found_inf = torch.tensor(0.0)
        return optimizer

    scaled_grads = [[512 * g for g in per_param] for per_param in grads]
    got, optimizer = oracles.run_optimizer(scaled, weights, scaled_grads)
    for g, w in zip(got, plain, strict=True):
        torch.testing.assert_close(g, w)

    optimizer.found_inf = torch.tensor(1.0)
    before = [p.clone() for p in optimizer.param_groups[0]["params"]]
    optimizer.step()
    for p, b in zip(optimizer.param_groups[0]["params"], before, strict=True):
        assert torch.equal(p, b)


def test_fused_on_cpu_fails_loudly():
    param = torch.nn.Parameter(torch.ones(3, 3))
    param.grad = torch.ones(3, 3)
    with pytest.raises(RuntimeError, match="fused=False"):
        Lars([param], fused=True).step()


def test_rejects_invalid_hyperparameters():
    with pytest.raises(ValueError, match="momentum"):
        Lars([torch.nn.Parameter(torch.ones(1))], momentum=-0.1)
