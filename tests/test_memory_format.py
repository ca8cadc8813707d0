"""channels_last: the convolutions really get NHWC tensors, and compute what contiguous computes.

Also the three memory levers together (channels_last, grad_accum, activation
checkpointing) under every precision choice.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from tests.conftest import CONF, register_in_runs
from tuneup import TuneupError, hookimpl
from tuneup.plugins.memory_format import apply_channels_last, batch_to_channels_last
from tuneup.zoo.models import SmallResNet

PRECISIONS = ("fp32", "tf32", "fp16", "bf16", "amp", "fp16-true", "bf16-true")
#: Seven runs (half precision convolutions are slow on CPU): smaller than TINY.
SMALLER = ["data.train_samples=128", "data.val_samples=32", "data.image_size=16"]


class ConvInputs:
    """A test plugin: the layout of every Conv2d input during training and validation."""

    def __init__(self) -> None:
        self.channels_last: list[bool] = []

    @hookimpl
    def on_fit_start(self, module):
        for conv in (m for m in module.modules() if isinstance(m, nn.Conv2d)):
            conv.register_forward_pre_hook(self._record)

    def _record(self, conv, args):
        self.channels_last.append(args[0].is_contiguous(memory_format=torch.channels_last))


@pytest.fixture
def conv_inputs(monkeypatch) -> ConvInputs:
    """Runs started by ``train`` record their Conv2d input layouts here."""
    spy = ConvInputs()
    register_in_runs(monkeypatch, [spy])
    return spy


@pytest.mark.parametrize(("choice", "nhwc"), [("channels_last", True), ("contiguous", False)])
def test_convolutions_see_channels_last_inputs(train, conv_inputs, choice, nhwc):
    summary, _ = train(f"memory_format={choice}")
    assert summary["status"] == "ok"
    assert len(conv_inputs.channels_last) > 0
    assert set(conv_inputs.channels_last) == {nhwc}  # every call, train and validation
    if nhwc:
        assert summary["plugins"]["memory_format"] == {
            "name": "channels_last",
            "converted_4d_tensors": 9,
        }
    else:
        assert "memory_format" not in summary["plugins"]  # contiguous loads no plugin


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_outputs_and_gradients_equal_contiguous_within_fp32_tolerance(mode):
    torch.manual_seed(0)
    contiguous = SmallResNet(3, 10, 8, [1, 1, 1])
    nhwc = apply_channels_last(copy.deepcopy(contiguous))
    assert nhwc.conv1.weight.is_contiguous(memory_format=torch.channels_last)
    x = torch.randn(4, 3, 16, 16)
    outputs = []
    for model, batch in ((contiguous, x), (nhwc, batch_to_channels_last(x))):
        getattr(model, mode)()
        out = model(batch)
        out.square().sum().backward()
        outputs.append((out, {n: p.grad for n, p in model.named_parameters()}))
    (expected, expected_grads), (got, grads) = outputs
    torch.testing.assert_close(got, expected)  # fp32 defaults: rtol 1.3e-6, atol 1e-5
    for name, grad in expected_grads.items():
        torch.testing.assert_close(grads[name], grad, msg=name)


def test_only_4d_tensors_of_a_batch_are_converted():
    images, labels = torch.randn(2, 3, 4, 4), torch.arange(2)
    x, y = batch_to_channels_last([images, labels])
    assert x.is_contiguous(memory_format=torch.channels_last) and torch.equal(x, images)
    assert y is labels
    nested = batch_to_channels_last({"image": images, "mask": torch.zeros(2, 4, 4)})
    assert nested["image"].is_contiguous(memory_format=torch.channels_last)
    assert nested["mask"].is_contiguous()


def test_model_without_4d_input_exits_1_saying_why(cli):
    result = cli("memory_format=channels_last", "model=mlp", tiny=False)
    assert result.returncode == 1, result.stdout[-2000:]
    assert "model=mlp has no 2-D convolution" in result.stderr
    assert "use memory_format=contiguous" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("precision", PRECISIONS)
def test_all_three_levers_compose_with_every_precision(train, conv_inputs, precision):
    if not (CONF / "precision" / f"{precision}.yaml").is_file():
        pytest.skip(f"conf/precision/{precision}.yaml does not exist yet")
    try:
        summary, _ = train(
            f"precision={precision}",
            "memory_format=channels_last",
            "grad_accum.steps=2",
            "activation_checkpointing=blocks",
            *SMALLER,
        )
    except TuneupError as exc:  # only the precision plugin may refuse this machine
        lines = [line for line in str(exc).splitlines()[1:] if line.strip()]
        if lines and all("[precision]" in line for line in lines):
            pytest.skip(f"precision={precision} is not available here: {exc}")
        raise
    assert summary["status"] == "ok"
    assert summary["steps"] == 128 // 64 and summary["micro_batches"] == 128 // 32
    assert summary["effective_batch_size"] == 64
    assert summary["plugins"]["activation_checkpointing"]["checkpointed_blocks"] == 3
    assert summary["saved_activation_bytes"] > 0
    assert conv_inputs.channels_last and all(conv_inputs.channels_last)
