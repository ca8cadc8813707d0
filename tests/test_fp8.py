"""precision=fp8 on CPU: which layers torchao converts and which stay in bf16, the refusals,
and (with precision.emulate=true: float8 casts, fp32 matmuls) training, resume and the order of
model setup. The float8 matmuls themselves need a GPU: tests/gpu/test_gpu_fp8.py."""

from __future__ import annotations

import copy
import importlib.metadata
import itertools

import pytest
import torch
from torch import nn

from tests.conftest import compose_config
from tests.test_grad_accum import final_weights
from tuneup import TuneupError, hookimpl
from tuneup.plugins.activation_checkpointing import is_checkpointed
from tuneup.plugins.precision import Plugin, fp8
from tuneup.plugins.precision.fp8 import convert_to_fp8, fp8_layers
from tuneup.trainer.components import Plan
from tuneup.trainer.environment import Environment
from tuneup.trainer.plugin_manager import PluginManager
from tuneup.zoo.models.gpt import GPT

pytest.importorskip("torchao", reason="the fp8 extra (torchao) is part of the test extra")

#: A two-layer GPT whose sizes float8 accepts (multiples of 16), tiny data, one epoch.
GPT_RUN = [
    "model=gpt",
    "data=synthetic_tokens",
    "data.vocab_size=64",
    "data.context=32",
    "model.width=32",
    "model.heads=2",
    "model.layers=2",
    "data.train_samples=64",
    "data.val_samples=32",
    "data.batch_size=16",
    "trainer.max_epochs=1",
    "trainer.enable_progress_bar=false",
    "trainer.log_every_n_steps=1",
    "trainer.accelerator=cpu",
]
FP8 = ["precision=fp8", "precision.emulate=true"]

CPU = Environment("cpu", 1, 1, "cpu", None, True, "avx512_bf16")
A100 = Environment("cuda", 1, 1, "NVIDIA A100", (8, 0), True, "bfloat16 tensor cores")
H100 = Environment("cuda", 1, 1, "NVIDIA H100 80GB HBM3", (9, 0), True, "bfloat16 tensor cores")


def gpt(width=32, layers=2) -> GPT:
    torch.manual_seed(0)
    return GPT(vocab_size=64, context=16, layers=layers, heads=2, width=width)


def float8_names(model: nn.Module) -> list[str]:
    return [name for name, m in model.named_modules() if type(m).__name__ == "Float8Linear"]


def check(overrides, env, model=True) -> list[str]:
    cfg = compose_config([*GPT_RUN, *overrides], tiny=False)
    return Plugin(cfg).check(cfg, env, Plan(cfg) if model else None)


# --- which layers, and the conversion --------------------------------------------------------


def test_first_and_last_layers_and_sizes_not_multiple_of_16_stay_in_bf16():
    layers = fp8_layers(gpt())
    assert layers.skipped == {
        "transformer.h.0.attn.c_attn": "first linear layer (precision.skip_first_last)",
        "lm_head": "last linear layer (precision.skip_first_last)",
    }
    assert len(layers.converted) == 7 and "transformer.h.1.mlp.c_fc" in layers.converted
    named = fp8_layers(gpt(), skip_first_last=False, skip=["mlp.c_proj"])
    assert named.skipped == {
        f"transformer.h.{i}.mlp.c_proj": "named in precision.skip" for i in (0, 1)
    }
    odd = fp8_layers(gpt(width=24), skip_first_last=False)
    assert odd.converted == () and odd.skipped["transformer.h.0.attn.c_attn"] == (
        "24 -> 72 features: float8 matmuls need multiples of 16"
    )


def test_conversion_swaps_exactly_those_layers_and_keeps_names_weights_and_tying():
    model = gpt()
    weights = dict(model.named_parameters())
    layers = fp8_layers(model)
    convert_to_fp8(model, layers, "tensorwise", emulate=True)
    assert float8_names(model) == list(layers.converted)
    assert dict(model.named_parameters()) == weights  # the same Parameter objects, same names
    assert model.lm_head.weight is model.transformer.wte.weight
    gpt().load_state_dict(model.state_dict())  # strict: checkpoints load with fp8 on or off


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_emulated_float8_rounds_like_float8_and_trains(recipe):
    """The casts are real on CPU too: outputs differ from fp32 by float8's rounding (3 mantissa
    bits: a few percent), and gradients reach every weight."""
    plain = gpt()
    model = copy.deepcopy(plain)
    convert_to_fp8(model, fp8_layers(model, skip_first_last=False), recipe, emulate=True)
    x = torch.randint(0, 64, (4, 16))
    fc = model.transformer.h[0].mlp.c_fc
    hidden = torch.randn(4, 16, 32)
    error = (fc(hidden) - plain.transformer.h[0].mlp.c_fc(hidden)).norm() / fc(hidden).norm()
    assert 1e-3 < error < 0.1
    model(x).logsumexp(-1).mean().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


# --- refusals: each names what is needed ------------------------------------------------------


def test_fp8_without_fp8_tensor_cores_is_a_check_error_naming_the_gpu_requirement():
    for env, where in ((CPU, "cpu has none"), (A100, "NVIDIA A100 (compute capability 8.0)")):
        (found,) = check(["precision=fp8", "compile=on"], env)
        assert "needs a GPU with float8 tensor cores (compute capability >= 8.9" in found
        assert where in found and "precision=amp" in found


def test_fp8_without_compile_is_refused_unless_allowed():
    (found,) = check(["precision=fp8"], H100)
    assert "without compile=on is slower than bf16" in found and "add compile=on" in found
    assert check(["precision=fp8", "compile=on"], H100) == []
    assert check(["precision=fp8", "precision.require_compile=false"], H100) == []


def test_missing_or_old_torchao_is_a_check_error_with_the_install_command(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    (found,) = check(FP8, CPU)
    assert "torchao is not installed: pip install 'tuneup[fp8]'" in found
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.8.0")
    (found,) = check(FP8, CPU)
    assert f"needs torchao>={fp8.TORCHAO_MIN}" in found and "found 0.8.0" in found


def test_bad_fp8_settings_are_reported_with_what_is_allowed():
    found = check([*FP8, "precision.recipe=blockwise", "precision.skip=[1]"], CPU)
    assert "precision.recipe='blockwise' is not allowed: expected one of" in found[0]
    assert "'tensorwise'" in found[0] and "'rowwise'" in found[0]
    assert "precision.skip=[1] is not allowed" in found[1]


def test_a_model_with_nothing_to_convert_is_a_check_error(make_config):
    cfg = make_config([*FP8, "trainer.accelerator=cpu"])  # small_resnet: convolutions
    (found,) = Plugin(cfg).check(cfg, CPU, Plan(cfg))
    assert "model=small_resnet keeps every nn.Linear in bf16: fc: only linear layer" in found
    (found,) = check([*FP8, "model.width=24"], CPU)
    assert "c_fc: 24 -> 96 features: float8 matmuls need multiples of 16" in found


# --- training, resume, composition (emulated) -------------------------------------------------


def test_emulated_fp8_run_trains_lists_its_layers_and_resumes(train, tmp_path):
    first, run_dir = train(*GPT_RUN, *FP8, tiny=False, run_dir=tmp_path / "first")
    fp8 = first["precision"]["fp8"]
    assert fp8["recipe"] == "tensorwise" and fp8["emulated"] is True
    assert fp8["forward"] == "float8_e4m3fn" and fp8["gradients"] == "float8_e5m2"
    assert len(fp8["converted"]) == 7 and set(fp8["kept_in_bf16"]) == {
        "transformer.h.0.attn.c_attn",
        "lm_head",
    }
    assert first["precision"]["autocast_dtype"] == "bfloat16"
    assert first["flops_per_sample"] > 0  # the model's own FLOPs, counted before conversion
    weights = final_weights(run_dir)
    assert list(weights) == [f"model.{name}" for name in gpt().state_dict()]  # as without fp8
    checkpoint = sorted((run_dir / "checkpoints").glob("*.ckpt"))[-1]
    resumed, _ = train(
        *GPT_RUN,
        *FP8,
        "trainer.max_epochs=2",
        f"resume={checkpoint}",
        tiny=False,
        run_dir=tmp_path / "resumed",
    )
    assert resumed["status"] == "ok" and resumed["steps"] == 2 * first["steps"]
    assert resumed["train_loss"] < first["loss_curve"]["loss"][0]


class Block(nn.Module):
    """A residual convolution: the class name activation_checkpointing=blocks looks for."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(16, 16, 3, padding=1)

    def forward(self, x):
        return x + torch.relu(self.conv(x))


class ConvNet(nn.Module):
    """Convolutions (memory_format), Blocks (checkpointing) and Linears of sizes fp8 takes."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.blocks = nn.Sequential(Block(), Block())
        self.head = nn.Sequential(
            nn.Flatten(),
            nn.Linear(256, 32),
            nn.GELU(),
            nn.Linear(32, 32),
            nn.GELU(),
            nn.Linear(32, 16),
        )

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)))


class Recorder:
    """Stands for a kernel swap (tryfirst) or compile (trylast): what model state it sees."""

    def __init__(self, seen: list) -> None:
        self.seen = seen

    def record(self, name, model):
        conv = model.blocks[1].conv.weight
        layout = conv.is_contiguous(memory_format=torch.channels_last)
        self.seen.append((name, float8_names(model), is_checkpointed(model.blocks[1]), layout))


class KernelSwap(Recorder):
    @hookimpl(tryfirst=True)
    def configure_model(self, model):
        self.record("kernels", model)


class Compile(Recorder):
    @hookimpl(trylast=True)
    def configure_model(self, model):
        self.record("compile", model)


def test_fp8_conversion_runs_between_kernel_swaps_and_compile_in_any_registration_order():
    """Kernel swaps see the plain model, compile the converted, checkpointed, channels_last one,
    and the gradients are the same whatever order fp8, checkpointing and memory_format were
    registered in (pluggy: the order of unflagged hooks is the reverse of registration)."""
    cfg = compose_config([*FP8, "activation_checkpointing=blocks", "memory_format=channels_last"])
    x = torch.randn(2, 3, 4, 4).contiguous(memory_format=torch.channels_last)
    results = []
    for order in itertools.permutations(("precision", "activation_checkpointing", "memory_format")):
        pm, seen = PluginManager(), []
        pm.register(Compile(seen), name="compile")
        for name in order:
            pm.register_named(name, cfg)
        pm.register(KernelSwap(seen), name="kernels")
        model = pm.pipeline("configure_model", "model", ConvNet(), cfg=cfg)
        converted = ["head.3"]  # the first and last Linear stay in bf16
        assert seen == [("kernels", [], False, False), ("compile", converted, True, True)], order
        with torch.autocast("cpu", dtype=torch.bfloat16):
            model(x).float().logsumexp(-1).mean().backward()
        results.append([p.grad for p in model.parameters()])
    for grads in results[1:]:
        for got, expected in zip(grads, results[0], strict=True):
            assert torch.equal(got, expected)


def test_converted_model_compiles_as_one_graph_with_eager_gradients():
    """compile=on runs last, on the converted model: torchao's float8 layers trace whole."""
    torch._dynamo.reset()
    model = gpt()
    convert_to_fp8(model, fp8_layers(model), "tensorwise", emulate=True)
    compiled = torch.compile(copy.deepcopy(model), backend="aot_eager", fullgraph=True)
    x = torch.randint(0, 64, (2, 16))
    for net in (model, compiled):
        net(x).logsumexp(-1).mean().backward()
    for eager, traced in zip(model.parameters(), compiled.parameters(), strict=True):
        torch.testing.assert_close(traced.grad, eager.grad)


def test_check_error_stops_the_run_before_anything_is_built(tmp_path):
    with pytest.raises(TuneupError, match=r"precision=fp8 needs a GPU with float8 tensor cores"):
        from tuneup import run

        run(compose_config([*GPT_RUN, "precision=fp8", "compile=on"], tiny=False), run_dir=tmp_path)
