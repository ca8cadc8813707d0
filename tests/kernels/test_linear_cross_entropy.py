"""Chunked linear + cross-entropy on its reference path against the unfused head."""

import importlib

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from tests.kernels.conftest import OpNames
from tuneup.plugins.kernels import linear_cross_entropy

lce_module = importlib.import_module("tuneup.plugins.kernels.linear_cross_entropy")


def make_inputs(rows=29, width=16, vocab=50, dtype=torch.float32, with_bias=True, seed=0):
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(rows, width, generator=generator, dtype=dtype).requires_grad_()
    weight = torch.randn(vocab, width, generator=generator, dtype=dtype).requires_grad_()
    bias = torch.randn(vocab, generator=generator, dtype=dtype).requires_grad_()
    target = torch.randint(0, vocab, (rows,), generator=generator)
    target[3::4] = -100
    return hidden, weight, target, bias if with_bias else None


def unfused(hidden, weight, target, bias, label_smoothing=0.0):
    logits = hidden @ weight.T if bias is None else hidden @ weight.T + bias
    return F.cross_entropy(logits.float(), target, label_smoothing=label_smoothing)


def grads_of(loss, hidden, weight, bias):
    inputs = (hidden, weight) if bias is None else (hidden, weight, bias)
    return torch.autograd.grad(loss, inputs)


@pytest.mark.parametrize("chunk_size", [1, 7, 29, 1000, None])
@pytest.mark.parametrize("with_bias", [True, False])
def test_matches_unfused_head(chunk_size, with_bias):
    hidden, weight, target, bias = make_inputs(with_bias=with_bias)
    loss = linear_cross_entropy(
        hidden, weight, target, bias, chunk_size=chunk_size, label_smoothing=0.1
    )
    expected = unfused(hidden, weight, target, bias, label_smoothing=0.1)
    torch.testing.assert_close(loss, expected)
    for got, want in zip(
        grads_of(3 * loss, hidden, weight, bias),
        grads_of(3 * expected, hidden, weight, bias),
        strict=True,
    ):
        torch.testing.assert_close(got, want)


def test_bfloat16_accumulates_weight_gradient_in_fp32():
    hidden, weight, target, bias = make_inputs(rows=64, dtype=torch.bfloat16)
    loss = linear_cross_entropy(hidden, weight, target, bias, chunk_size=8)
    expected = unfused(
        *(t.detach().float().requires_grad_() for t in (hidden, weight)),
        target,
        bias.detach().float().requires_grad_(),
    )
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, expected, atol=2e-2, rtol=0)
    grad_weight = grads_of(loss, hidden, weight, bias)[1]
    assert grad_weight.dtype == torch.bfloat16


def test_autocast_casts_like_linear():
    hidden, weight, target, bias = make_inputs()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = linear_cross_entropy(hidden, weight, target, bias)
        expected = F.cross_entropy(F.linear(hidden, weight, bias).float(), target)
    torch.testing.assert_close(loss, expected)
    grads, expected_grads = (
        grads_of(loss, hidden, weight, bias),
        grads_of(expected, hidden, weight, bias),
    )
    for got, want in zip(grads, expected_grads, strict=True):
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, want, atol=2e-3, rtol=0.05)


def test_traces_in_one_graph():
    hidden, weight, target, bias = make_inputs()
    compiled = torch.compile(linear_cross_entropy, backend="aot_eager", fullgraph=True)
    loss = compiled(hidden, weight, target, bias, chunk_size=8)
    torch.testing.assert_close(loss, unfused(hidden, weight, target, bias))
    torch.testing.assert_close(
        grads_of(loss, hidden, weight, bias),
        grads_of(unfused(hidden, weight, target, bias), hidden, weight, bias),
    )


def test_gradcheck_float64():
    hidden, weight, target, bias = make_inputs(rows=7, width=3, vocab=5, dtype=torch.float64)
    assert torch.autograd.gradcheck(
        lambda h, w, b: linear_cross_entropy(h, w, target, b, chunk_size=3, label_smoothing=0.1),
        (hidden, weight, bias),
    )


@pytest.mark.parametrize("with_bias", [True, False])
def test_opcheck(with_bias):
    hidden, weight, target, bias = make_inputs(rows=9, width=4, vocab=11, with_bias=with_bias)
    args = (hidden, weight, target, bias, 4, 0.0, -100, True)
    torch.library.opcheck(lce_module.linear_cross_entropy_op, args)


def test_without_autograd_only_the_loss_is_computed():
    hidden, weight, target, bias = make_inputs()
    with torch.no_grad():
        loss, *grads = lce_module.linear_cross_entropy_op(
            hidden, weight, target, bias, 8, 0.0, -100, False
        )
    assert [g.numel() for g in grads] == [0, 0, 0]
    torch.testing.assert_close(loss, unfused(hidden, weight, target, bias))


class LargestOutput(TorchDispatchMode):
    """Records the largest number of elements any op produced."""

    largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple | list) else [out]:
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def test_never_holds_more_than_one_chunk_of_logits():
    """Every tensor the op's body creates, not only its outputs, is at most a chunk of logits."""
    hidden, weight, target, bias = make_inputs(rows=64, width=4, vocab=200)
    with LargestOutput() as unfused_ops:
        grads_of(unfused(hidden, weight, target, bias), hidden, weight, bias)
    with torch.no_grad(), LargestOutput() as fused_ops:
        args = (hidden, weight, target, bias, 8, 0.1, -100, True, "reference")
        lce_module.chunked_loss_and_grads(*args)
    assert unfused_ops.largest == 64 * 200
    assert fused_ops.largest == 8 * 200


def test_default_chunk_size_keeps_a_chunk_of_logits_about_four_times_hidden():
    assert lce_module.default_chunk_size(16384, 2048, 32768) == 4096  # 4 chunks
    assert lce_module.default_chunk_size(16384, 768, 32768) == 1490  # GPT-2 small: 11 chunks
    assert lce_module.default_chunk_size(10, 64, 32) == 10
    with pytest.raises(ValueError, match="chunk_size"):
        linear_cross_entropy(*make_inputs(), chunk_size=-1)


def test_backward_scales_the_saved_gradients_and_fills_nothing():
    """No zeros for the never-differentiated gradient outputs (autograd made tensors of the
    hidden states', weight's and bias' sizes for them each backward)."""
    hidden, weight, target, bias = make_inputs()
    loss = linear_cross_entropy(hidden, weight, target, bias=bias)
    with OpNames() as ops:
        loss.backward()
    assert not [name for name in ops.names if "zero" in name or "fill" in name], ops.names
