"""Activation checkpointing: fewer bytes kept for backward, and exactly the gradients of ``off``."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy

from tests.conftest import compose_config
from tests.test_grad_accum import final_weights
from tuneup import TuneupError, hookimpl
from tuneup.plugins.activation_checkpointing import (
    SavePolicy,
    checkpoint_blocks,
    is_checkpointed,
    select_blocks,
)
from tuneup.trainer.plugin_manager import PluginManager
from tuneup.zoo.models import SmallResNet
from tuneup.zoo.models.gpt import GPT


def resnet(blocks=(1, 1, 1), width=8) -> nn.Module:
    torch.manual_seed(0)
    return SmallResNet(3, 10, width, list(blocks))


def step(model: nn.Module, x: torch.Tensor, owner=None) -> dict[str, torch.Tensor]:
    """One training forward/backward; the gradients and buffers it leaves (in ``owner``)."""
    owner = owner or model
    model.train()
    model(x).logsumexp(-1).sum().backward()
    grads = {f"grad {n}": p.grad for n, p in owner.named_parameters()}
    return {**grads, **dict(owner.named_buffers())}


def test_gradients_and_batchnorm_statistics_identical_to_off():
    off = resnet()
    on = copy.deepcopy(off)
    assert checkpoint_blocks(on, ["BasicBlock"]) == ["layers.0.0", "layers.1.0", "layers.2.0"]
    x = torch.randn(4, 3, 16, 16)
    expected, got = step(off, x), step(on, x)
    assert expected.keys() == got.keys()
    for name, value in expected.items():
        assert torch.equal(value, got[name]), name  # bitwise, running stats included
    assert int(got["layers.0.0.bn1.num_batches_tracked"]) == 1  # not counted twice


def test_parameter_names_and_state_dict_keys_unchanged():
    off, on = resnet(), resnet()
    checkpoint_blocks(on, ["BasicBlock"])
    assert [n for n, _ in on.named_parameters()] == [n for n, _ in off.named_parameters()]
    on.load_state_dict(off.state_dict())  # strict: a checkpoint of either loads into the other
    assert type(on.layers[0][0]).__name__ == "BasicBlock"
    assert checkpoint_blocks(on, ["BasicBlock"]) and is_checkpointed(on.layers[0][0])  # idempotent


def test_checkpointed_model_survives_pickle_and_deepcopy():
    """torch.save(model), spawned processes and EMA copies still get a working model."""
    model = resnet()
    checkpoint_blocks(model, ["BasicBlock"])
    x = torch.randn(2, 3, 16, 16)
    expected = step(copy.deepcopy(model), x)
    for clone in (pickle.loads(pickle.dumps(model)), copy.deepcopy(model)):
        block = clone.layers[0][0]
        assert is_checkpointed(block) and block.forward.block is block
        got = step(clone, x)
        for name, value in expected.items():
            assert torch.equal(value, got[name]), name


def test_every_n_checkpoints_the_first_of_each_n_blocks():
    model = resnet(blocks=(2, 2, 1))
    assert select_blocks(model, ["BasicBlock"], every_n=2) == [
        "layers.0.0",
        "layers.1.0",
        "layers.2.0",
    ]
    assert select_blocks(model, ["BasicBlock"], every_n=3) == ["layers.0.0", "layers.1.1"]
    checkpoint_blocks(model, ["BasicBlock"], every_n=3)
    flags = [is_checkpointed(m) for m in model.modules() if type(m).__name__ == "BasicBlock"]
    assert flags == [True, False, False, True, False]


def test_nested_block_types_checkpoint_the_outer_block_only():
    model = resnet()
    assert select_blocks(model, ["Sequential", "BasicBlock"]) == ["layers"]


def test_saved_activation_bytes_drop_at_least_40_percent_and_weights_match(train, tmp_path):
    """The default ResNet (width 16), all blocks checkpointed; summary figure from plugins/measure.
    4 steps of 32 samples: a whole run, each step's weights from the one before."""
    runs = {}
    for choice in ("off", "blocks"):
        summary, run_dir = train(
            f"activation_checkpointing={choice}",
            "model.width=16",
            "trainer.accelerator=cpu",  # bitwise on CPU; GPU: tests/gpu/
            "data.train_samples=128",
            "data.val_samples=32",
            run_dir=tmp_path / choice,
        )
        runs[choice] = summary, final_weights(run_dir)
    (off, off_state), (on, on_state) = runs["off"], runs["blocks"]
    assert on["plugins"]["activation_checkpointing"]["checkpointed_blocks"] == 3
    assert off["saved_activation_bytes"] > 0  # reported with checkpointing off too
    assert on["saved_activation_bytes"] <= 0.6 * off["saved_activation_bytes"]
    assert on_state.keys() == off_state.keys()
    for name, value in off_state.items():
        assert torch.equal(value, on_state[name]), name  # a whole training run, bit for bit


def test_model_without_the_block_class_is_a_check_error(train):
    with pytest.raises(TuneupError) as info:
        train("activation_checkpointing=blocks", "model=mlp", "model.hidden=[8]", tiny=False)
    message = str(info.value)
    assert "activation_checkpointing.block_types=['BasicBlock', 'Bottleneck'," in message
    assert "model=mlp, which has no module of these classes" in message and "Linear" in message


@pytest.mark.parametrize("override", ["activation_checkpointing.every_n=0",
                                      "activation_checkpointing.block_types=[]"])  # fmt: skip
def test_bad_settings_are_check_errors(train, override):
    with pytest.raises(TuneupError, match=override.split("=")[0]):
        train("activation_checkpointing=blocks", override)


class Recorder:
    """A stand-in for a kernel swap (tryfirst) or compile (trylast): what state it receives."""

    def __init__(self, seen: list) -> None:
        self.seen = seen

    def record(self, name, model):
        block = model.layers[0][0]
        self.seen.append((name, is_checkpointed(block), block.conv1.weight.is_contiguous()))


class KernelSwap(Recorder):
    @hookimpl(tryfirst=True)
    def configure_model(self, model):
        self.record("kernels", model)


class Compile(Recorder):
    @hookimpl(trylast=True)
    def configure_model(self, model):
        self.record("compile", model)


@pytest.mark.parametrize("order", [("memory_format", "activation_checkpointing"),
                                   ("activation_checkpointing", "memory_format")])  # fmt: skip
def test_setup_order_does_not_depend_on_config_order(order):
    """Kernel swaps see the plain model, compile sees both levers applied, whatever the order
    the two were registered in; and the model they produce is the same."""
    cfg = compose_config(["memory_format=channels_last", "activation_checkpointing=blocks"])
    pm, seen = PluginManager(), []
    pm.register(Compile(seen), name="compile")
    for name in order:
        pm.register_named(name, cfg)
    pm.register(KernelSwap(seen), name="kernels")
    called = [impl.plugin_name for impl in pm.call_order("configure_model")]
    assert called[1:3] == list(reversed(order))  # pluggy: the later registered runs first
    model = pm.pipeline("configure_model", "model", resnet(), cfg=cfg)
    assert seen == [("kernels", False, True), ("compile", True, False)]
    for tensor in [*model.parameters(), *model.buffers()]:
        if tensor.dim() == 4:
            assert tensor.is_contiguous(memory_format=torch.channels_last)
    reference = resnet().to(memory_format=torch.channels_last)
    x = torch.randn(2, 3, 16, 16).contiguous(memory_format=torch.channels_last)
    expected, got = step(reference, x), step(model, x)
    for name, value in expected.items():
        assert torch.equal(value, got[name]), name


def test_compiles_as_one_graph_without_counting_batchnorm_twice():
    """torch.compile (plugins/compile.py runs after this plugin) traces the blocks whole."""
    off = resnet()
    on = copy.deepcopy(off)
    checkpoint_blocks(on, ["BasicBlock"])
    compiled = torch.compile(on, backend="aot_eager", fullgraph=True)  # a graph break raises
    x = torch.randn(4, 3, 16, 16)
    expected, got = step(off, x), step(compiled, x, owner=on)
    for name, value in expected.items():
        torch.testing.assert_close(got[name], value, msg=name)


# --- selective: a policy by op -----------------------------------------------------------------


def gpt(layers=2, width=32) -> GPT:
    torch.manual_seed(0)
    return GPT(vocab_size=64, context=16, layers=layers, heads=2, width=width)


class Recording(SavePolicy):
    """The policy, noting what it decided for each op of the forward (not the recompute)."""

    def __init__(self, **settings) -> None:
        super().__init__(**settings)
        self.decisions: list[tuple[str, bool]] = []

    def __call__(self, ctx, func, *args, **kwargs):
        decision = super().__call__(ctx, func, *args, **kwargs)
        if not ctx.is_recompute:
            self.decisions.append((func.name(), decision is CheckpointPolicy.MUST_SAVE))
        return decision


def test_selective_keeps_matmul_and_attention_outputs_and_recomputes_the_rest():
    policy = Recording()
    model = gpt(layers=1)
    checkpoint_blocks(model, ["Block"], policy=policy)
    model(torch.randint(0, 64, (2, 16))).sum().backward()
    kept = [name for name, saved in policy.decisions if saved]
    recomputed = {name for name, saved in policy.decisions if not saved}
    # c_attn (3x wider), attention, attn.c_proj, mlp.c_proj; not mlp.c_fc (4x wider: recomputed)
    assert kept == [
        "aten::addmm",
        "aten::_scaled_dot_product_flash_attention_for_cpu",
        "aten::addmm",
        "aten::addmm",
    ]
    assert {"aten::native_layer_norm", "aten::gelu", "aten::addmm"} <= recomputed
    keep_all = Recording(recompute_wider_than=None)
    model = gpt(layers=1)
    checkpoint_blocks(model, ["Block"], policy=keep_all)
    model(torch.randint(0, 64, (2, 16))).sum().backward()
    assert [name for name, saved in keep_all.decisions if saved].count("aten::addmm") == 4


@pytest.mark.parametrize("make", [gpt, resnet], ids=["gpt", "resnet"])
def test_selective_gradients_and_statistics_identical_to_off(make):
    off = make()
    on = copy.deepcopy(off)
    assert checkpoint_blocks(on, ["Block", "BasicBlock"], policy=SavePolicy())
    x = torch.randint(0, 64, (2, 16)) if make is gpt else torch.randn(4, 3, 16, 16)
    expected, got = step(off, x), step(on, x)
    for name, value in expected.items():
        assert torch.equal(value, got[name]), name  # bitwise, BatchNorm statistics included


def test_selective_model_survives_pickle_and_compiles_as_one_graph():
    model = gpt()
    checkpoint_blocks(model, ["Block"], policy=SavePolicy())
    x = torch.randint(0, 64, (2, 16))
    expected = step(copy.deepcopy(model), x)
    clone = pickle.loads(pickle.dumps(model))
    assert clone.transformer.h[0].forward.policy.names == SavePolicy().names
    compiled = torch.compile(clone, backend="aot_eager", fullgraph=True)
    got = step(compiled, x, owner=clone)
    for name, value in expected.items():
        torch.testing.assert_close(got[name], value, msg=name)


#: A 4-layer GPT on tiny token data, 3 steps (measure counts the 2nd step's saved bytes).
GPT_RUN = [
    "model=gpt",
    "data=synthetic_tokens",
    "data.vocab_size=64",
    "data.context=64",
    "model.width=32",
    "model.heads=2",
    "model.layers=4",
    "data.train_samples=48",
    "data.batch_size=16",
    "trainer.max_epochs=1",
    "++trainer.limit_val_batches=0",
    "trainer.log_every_n_steps=1",
    "checkpoint=off",
    "trainer.enable_progress_bar=false",
    "trainer.accelerator=cpu",
]


def test_selective_saves_40_percent_fewer_bytes_on_the_gpt_and_trains_like_off(train, tmp_path):
    """The summary's saved_activation_bytes (plugins/measure/saved_bytes.py) sees what selective keeps."""
    off, selective = (
        train(*GPT_RUN, f"activation_checkpointing={name}", tiny=False, run_dir=tmp_path / name)[0]
        for name in ("off", "selective")
    )
    assert selective["saved_activation_bytes"] <= 0.6 * off["saved_activation_bytes"]
    assert selective["loss_curve"]["loss"] == off["loss_curve"]["loss"]  # exactly


@pytest.mark.parametrize(("override", "message"), [
    ("activation_checkpointing.save=[matmul,softmax]", "expected a non-empty list of matmul, "
                                                       "attention, convolution"),
    ("activation_checkpointing.recompute_wider_than=0.5", "expected a number >= 1 or None"),
])  # fmt: skip
def test_bad_selective_settings_are_check_errors(train, override, message):
    with pytest.raises(TuneupError, match=message):
        train("activation_checkpointing=selective", override)
