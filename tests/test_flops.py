"""The FLOPs behind MFU: model=gpt's attention counted as computed (causal), against hand counts."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F
from torch.utils.flop_counter import FlopCounterMode

from tests.conftest import compose_config
from tuneup.trainer.components import Plan
from tuneup.trainer.flops import AttentionCalls, flops_per_sample


def gpt_flops_per_sequence(layers: int, width: int, context: int, vocab: int) -> int:
    """Forward: 12 width^2 weights per token and layer, causal attention (half of the T x T
    scores, for q k^T and p v), the output head; training is 3 forwards (two matmuls for
    the gradients of each one)."""
    linear = 2 * context * 12 * width**2
    attention = 2 * (2 * context * context * width) // 2
    head = 2 * context * width * vocab
    return 3 * (layers * (linear + attention) + head)


@pytest.mark.parametrize(("layers", "width", "context"), [(2, 32, 64), (4, 64, 128)])
def test_gpt_flops_count_attention_as_causal(layers, width, context):
    cfg = compose_config(
        [
            "model=gpt",
            "data=synthetic_tokens",
            f"model.layers={layers}",
            f"model.width={width}",
            "model.heads=4",
            f"data.context={context}",
            "data.vocab_size=256",
        ],
        tiny=False,
    )
    assert flops_per_sample(Plan(cfg)) == gpt_flops_per_sequence(layers, width, context, 256)


def test_gpt2_small_shape_is_734_gflop_per_sequence_not_the_unmasked_792():
    """The shape of docs/benchmarks.md's MFU comparison (12 x 768, context 1024, 32k tokens)."""
    cfg = compose_config(
        [
            "model=gpt",
            "data=synthetic_tokens",
            "model.layers=12",
            "model.heads=12",
            "model.width=768",
            "data.context=1024",
            "data.vocab_size=32768",
        ],
        tiny=False,
    )
    flops = flops_per_sample(Plan(cfg))
    unmasked = flops + 3 * 12 * 2 * 1024 * 1024 * 768
    assert round(flops / 1e9, 1) == 734.4 and round(unmasked / 1e9, 1) == 792.4


@pytest.mark.parametrize("needs_grad", [(True, True, True), (False, True, True)])
def test_the_masked_half_is_half_of_what_flop_counter_counted(needs_grad):
    q, k, v = (torch.empty(2, 4, 32, 8, device="meta", requires_grad=g) for g in needs_grad)
    with FlopCounterMode(display=False) as counter, AttentionCalls() as calls:
        F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
        F.scaled_dot_product_attention(q, k, v).sum().backward()  # unmasked: not corrected
    unmasked_total = counter.get_total_flops() / 2
    assert calls.masked_flops() == unmasked_total / 2


def test_an_architecture_is_counted_once_a_process_and_another_afresh(monkeypatch):
    """A sweep's jobs (and the suite's runs) share a process: the same zoo model on the same
    data shape is counted once; another width, data shape or the user's own model is not
    taken from the cache."""
    from tuneup.trainer import flops

    counted = []
    once = flops.count_flops_once
    monkeypatch.setattr(flops, "_counted", {})
    monkeypatch.setattr(flops, "count_flops_once", lambda plan: counted.append(plan) or once(plan))

    def count(*overrides):
        return flops.count_flops(Plan(compose_config(["model=mlp", *overrides], tiny=False)))

    first = count("data.image_size=8")
    assert count("data.image_size=8", "optimizer.lr=0.5", "seed=3") == first  # the same model
    assert len(counted) == 1 and first[0] > 0
    wider = count("data.image_size=8", "model.hidden=[64]")
    bigger = count("data.image_size=16")
    assert len(counted) == 3 and len({first[0], wider[0], bigger[0]}) == 3
    own = [
        "model=custom",
        "model._target_=tuneup.zoo.models.small.MLP",
        "model.in_features=192",
        "model.num_classes=10",
        "model.hidden=[32]",
        "data.image_size=8",
    ]
    assert count(*own) == count(*own) and count(*own)[0] > 0
    assert len(counted) == 6  # the user's code: counted each time
