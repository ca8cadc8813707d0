"""precision=fp8 where it runs: float8 matmuls on a GPU with float8 tensor cores (compute
capability >= 8.9), through torchao. On CPU, tests/test_fp8.py checks the conversion, the
refusals and emulated training; here the numerics of the real matmuls, and training with
compile, FSDP and resume. Marked ``gpu``; skipped, saying why, without such a GPU or torchao.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tuneup.plugins.precision.fp8 import convert_to_fp8, fp8_layers
from tuneup.zoo.models.gpt import GPT

pytestmark = pytest.mark.gpu

GPU = "trainer.accelerator=gpu"
#: A GPT whose layers float8 takes (sizes multiples of 16), 24 steps of 16 sequences.
GPT_RUN = [
    "model=gpt",
    "data=synthetic_tokens",
    "data.vocab_size=512",
    "data.context=128",
    "model.width=256",
    "model.heads=4",
    "model.layers=2",
    "data.train_samples=384",
    "data.val_samples=64",
    "data.batch_size=16",
    "trainer.max_epochs=1",
    "trainer.enable_progress_bar=false",
    "trainer.log_every_n_steps=1",
]


@pytest.fixture(autouse=True)
def float8_gpu():
    pytest.importorskip("torchao", reason="precision=fp8 needs the fp8 extra (torchao)")
    if torch.cuda.get_device_capability() < (8, 9):
        name = torch.cuda.get_device_name()
        pytest.skip(f"{name} has no float8 tensor cores (compute capability < 8.9)")


class CountOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls[func.name()] = self.calls.get(func.name(), 0) + 1
        return func(*args, **(kwargs or {}))


def gpt() -> GPT:
    torch.manual_seed(0)
    return GPT(vocab_size=512, context=128, layers=2, heads=4, width=256).cuda()


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_float8_matmuls_run_on_tensor_cores_and_agree_with_the_emulation(recipe):
    """Three float8 matmuls per converted layer and step (output, input and weight gradients),
    giving what the emulated casts give up to the matmuls' accumulation order. That order
    compounds: each layer's output is cast to float8 again, where a last-bit difference can
    move a value by one float8 step (2^-3 relative), so the logits of two layers differ by a
    few percent (H200, torchao 0.17, 2026-11-27: 3.0% tensorwise, 2.5% rowwise; a missing or
    wrong scale gives errors of order 1)."""
    real, emulated = gpt(), gpt()
    convert_to_fp8(real, fp8_layers(real), recipe)
    convert_to_fp8(emulated, fp8_layers(emulated), recipe, emulate=True)
    x = torch.randint(0, 512, (4, 128), device="cuda")
    outputs = []
    for model in (real, emulated):
        with CountOps() as ops, torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(x)
            out.float().logsumexp(-1).mean().backward()
        outputs.append((out.float(), ops.calls.get("aten::_scaled_mm", 0)))
    (got, scaled_mms), (want, emulated_mms) = outputs
    assert scaled_mms == 3 * len(fp8_layers(real).converted) and emulated_mms == 0
    error = (got - want).norm() / want.norm()
    assert error < 5e-2
    for p_real, p_emulated in zip(real.parameters(), emulated.parameters(), strict=True):
        relative = (p_real.grad - p_emulated.grad).norm() / p_emulated.grad.norm().clamp_min(1e-12)
        assert relative < 5e-2


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_fp8_with_compile_trains_like_bf16(train, tmp_path, recipe):
    torch._dynamo.reset()
    fp8, _ = train(
        GPU,
        *GPT_RUN,
        "precision=fp8",
        f"precision.recipe={recipe}",
        "compile=on",
        tiny=False,
        run_dir=tmp_path / "fp8",
    )
    torch._dynamo.reset()
    bf16, _ = train(
        GPU, *GPT_RUN, "precision=bf16", "compile=on", tiny=False, run_dir=tmp_path / "bf16"
    )
    layers = fp8["precision"]["fp8"]
    assert layers["recipe"] == recipe and layers["emulated"] is False
    assert len(layers["converted"]) == 7 and set(layers["kept_in_bf16"]) == {
        "transformer.h.0.attn.c_attn",
        "lm_head",
    }
    curve = fp8["loss_curve"]["loss"]
    assert curve[-1] < curve[0] - 0.5  # it learns
    assert fp8["train_loss"] == pytest.approx(bf16["train_loss"], rel=0.05)
    assert fp8["flops_per_sample"] == bf16["flops_per_sample"]  # the model's own FLOPs
    assert fp8["mfu"] is not None or fp8["mfu_note"].startswith("no known peak")


def test_fp8_under_fsdp_and_resume(train, tmp_path):
    """FSDP gathers the weights in bf16 and each matmul casts them to float8 (eager here, so a
    failure is FSDP's and not compile's; fp8 with compile: above)."""
    first, run_dir = train(
        GPU,
        *GPT_RUN,
        "precision=fp8",
        "precision.require_compile=false",
        "strategy=fsdp",
        "trainer.devices=1",
        tiny=False,
        run_dir=tmp_path / "first",
    )
    assert first["plugins"]["strategy"]["used"] == "fsdp"
    assert len(first["precision"]["fp8"]["converted"]) == 7
    checkpoint = max((run_dir / "checkpoints").glob("*.ckpt"))
    torch._dynamo.reset()
    resumed, _ = train(
        GPU,
        *GPT_RUN,
        "precision=fp8",
        "compile=on",
        "trainer.max_epochs=2",
        f"resume={checkpoint}",
        tiny=False,
        run_dir=tmp_path / "resumed",
    )
    assert resumed["status"] == "ok" and resumed["steps"] == 2 * first["steps"]
    assert resumed["train_loss"] < first["loss_curve"]["loss"][0]
