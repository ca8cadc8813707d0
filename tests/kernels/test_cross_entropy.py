"""The cross-entropy op on its reference path (CPU) against torch's F.cross_entropy."""

import importlib

import pytest
import torch
import torch.nn.functional as F

from tests.kernels.conftest import OpNames
from tuneup.plugins.kernels import cross_entropy, implementation, ran

ce_module = importlib.import_module("tuneup.plugins.kernels.cross_entropy")


def make_inputs(rows=37, classes=103, dtype=torch.float32, ignored_every=5, seed=0):
    generator = torch.Generator().manual_seed(seed)
    logits = (3 * torch.randn(rows, classes, generator=generator)).to(dtype).requires_grad_()
    target = torch.randint(0, classes, (rows,), generator=generator)
    if ignored_every:
        target[::ignored_every] = -100
    return logits, target


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_loss_and_grad_match_torch(dtype, label_smoothing):
    logits, target = make_inputs(dtype=dtype)
    loss = cross_entropy(logits, target, label_smoothing=label_smoothing)
    (grad,) = torch.autograd.grad(2.5 * loss, logits)

    expected_logits = logits.detach().float().requires_grad_()
    expected = F.cross_entropy(expected_logits, target, label_smoothing=label_smoothing)
    (expected_grad,) = torch.autograd.grad(2.5 * expected, expected_logits)

    assert loss.dtype == torch.float32 and grad.dtype == dtype
    torch.testing.assert_close(loss, expected)
    grad_tolerance = {torch.float32: 1e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}[dtype]
    torch.testing.assert_close(grad.float(), expected_grad, atol=grad_tolerance, rtol=0)


def test_custom_ignore_index_and_all_rows_ignored():
    logits, target = make_inputs(ignored_every=None)
    target[::3] = 7
    loss = cross_entropy(logits, target, ignore_index=7)
    torch.testing.assert_close(loss, F.cross_entropy(logits, target, ignore_index=7))
    all_ignored = torch.full_like(target, -100)
    assert cross_entropy(logits, all_ignored).isnan()
    assert F.cross_entropy(logits, all_ignored).isnan()


def test_transposed_logits():
    logits, target = make_inputs(rows=11, classes=37)
    transposed = logits.detach().T.contiguous().T.requires_grad_()
    loss = cross_entropy(transposed, target)
    torch.testing.assert_close(loss, F.cross_entropy(logits, target))
    (grad,) = torch.autograd.grad(loss, transposed)
    torch.testing.assert_close(
        grad, torch.autograd.grad(F.cross_entropy(logits, target), logits)[0]
    )


def test_gradcheck_float64():
    logits, target = make_inputs(rows=6, classes=5, dtype=torch.float64, ignored_every=4)
    assert torch.autograd.gradcheck(
        lambda x: cross_entropy(x, target, label_smoothing=0.2), (logits,)
    )


@pytest.mark.parametrize("compute_grad", [True, False])
def test_opcheck(compute_grad):
    logits, target = make_inputs(rows=9, classes=11)
    torch.library.opcheck(
        ce_module.cross_entropy_op,
        (logits.requires_grad_(compute_grad), target, 0.1, -100, compute_grad),
    )


def test_traces_in_one_graph():
    logits, target = make_inputs(rows=8, classes=13)
    compiled = torch.compile(cross_entropy, backend="aot_eager", fullgraph=True)
    loss = compiled(logits, target, label_smoothing=0.1)
    (grad,) = torch.autograd.grad(loss, logits)
    expected = cross_entropy(logits, target, label_smoothing=0.1)
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(grad, torch.autograd.grad(expected, logits)[0])


def test_no_gradient_is_computed_without_autograd():
    logits, target = make_inputs()
    with torch.no_grad():
        loss, grad = ce_module.cross_entropy_op(logits, target, 0.0, -100, False)
    assert grad.numel() == 0
    torch.testing.assert_close(loss, F.cross_entropy(logits.detach(), target))


def test_out_of_range_target_raises():
    logits, target = make_inputs()
    target[1] = 103
    with pytest.raises(RuntimeError, match="out of range"):
        cross_entropy(logits, target)


def test_cpu_runs_and_records_the_reference():
    ran.clear()
    assert implementation("cpu") == "reference"
    logits, target = make_inputs()
    cross_entropy(logits, target)
    assert ran == {"cross_entropy": {"reference"}}


def test_backward_scales_the_saved_gradient_and_fills_nothing():
    """One multiplication: no zeros for the never-differentiated gradient output (autograd
    made a tensor of the logits' size for it each backward: 1 GiB at 16k x 32k bf16)."""
    logits, target = make_inputs()
    loss = cross_entropy(logits, target)
    with OpNames() as ops:
        loss.backward()
    assert not [name for name in ops.names if "zero" in name or "fill" in name], ops.names
    assert ops.names.count("aten::mul.Tensor") == 1
