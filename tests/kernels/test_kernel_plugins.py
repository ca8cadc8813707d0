"""The kernel ops as users switch them on: kernels=[...], optimizer=lamb|lars, experiment=large_batch."""

import csv

import pytest
import torch

from tests.conftest import compose_config
from tuneup.trainer.runner import ConfigError, run

GPT = [
    "model=gpt",
    "data=synthetic_tokens",
    "model.layers=2",
    "model.width=32",
    "model.heads=2",
    "data.context=16",
    "data.vocab_size=64",
    "data.train_samples=320",
    "data.val_samples=32",
    "data.batch_size=16",
    "trainer.max_steps=20",
    "trainer.max_epochs=-1",
    "trainer.log_every_n_steps=1",
    "trainer.enable_progress_bar=false",
]


def train_losses(run_dir) -> list[float]:
    rows = csv.DictReader((run_dir / "metrics.csv").open())
    return [float(row["train/loss"]) for row in rows if row.get("train/loss")]


def test_fused_loss_ops_match_the_unfused_run_and_say_what_ran(train, tmp_path):
    cpu = "trainer.accelerator=cpu"  # on CUDA the Triton kernels run: tests/gpu/
    fused, fused_dir = train(
        *GPT,
        cpu,
        "kernels=[cross_entropy,linear_cross_entropy]",
        tiny=False,
        run_dir=tmp_path / "fused",
    )
    plain, plain_dir = train(*GPT, cpu, tiny=False, run_dir=tmp_path / "plain")
    losses, reference = train_losses(fused_dir), train_losses(plain_dir)
    assert len(losses) == len(reference) == 20
    torch.testing.assert_close(losses, reference, atol=1e-5, rtol=0)
    assert losses[-1] < losses[0] - 0.5  # it trained
    assert abs(fused["val"]["acc"] - plain["val"]["acc"]) < 1e-6
    # no silent fallback: the summary says what actually ran (CPU: the reference path)
    assert fused["kernels"] == {
        "cross_entropy": ["reference"],
        "linear_cross_entropy": ["reference"],
    }
    assert fused["plugins"]["kernels"]["implementation"] == "reference"
    # the head was fused in place: same parameters, same checkpoint keys
    keys = [
        sorted(
            torch.load(next((d / "checkpoints").glob("*.ckpt")), weights_only=True)["state_dict"]
        )
        for d in (fused_dir, plain_dir)
    ]
    assert keys[0] == keys[1]


def test_linear_cross_entropy_on_a_model_without_the_head_is_a_clear_error(tmp_path):
    with pytest.raises(
        ConfigError,
        match=r"linear_cross_entropy.head='lm_head': model small_resnet has nothing "
        r"there, not an nn.Linear",
    ):
        run(compose_config(["kernels=[linear_cross_entropy]"]), run_dir=tmp_path)


def test_require_triton_on_cpu_is_a_check_error(tmp_path):
    with pytest.raises(ConfigError, match=r"kernels.require_triton=true, but on cpu .*reference"):
        overrides = ["kernels=[cross_entropy]", "kernels.require_triton=true"]
        run(compose_config([*overrides, "trainer.accelerator=cpu"]), run_dir=tmp_path)


@pytest.mark.parametrize(("optimizer", "lr"), [("lamb", 0.02), ("lars", 5.0)])
def test_large_batch_optimizers_train_and_report_their_implementation(train, optimizer, lr):
    summary, run_dir = train(
        f"optimizer={optimizer}",
        f"optimizer.lr={lr}",
        "data.signal=0.3",
        "data.image_size=32",
        "trainer.max_epochs=3",
        "trainer.accelerator=cpu",
    )  # lr tuned at 32 pixels
    assert summary["optimizer"] == {"implementation": "reference", "lr": pytest.approx(lr)}
    losses = train_losses(run_dir)
    assert losses[-1] < losses[0] - 0.2  # it trains
    assert summary["plugins"]["large_batch"]["name"] == optimizer


def test_fused_optimizer_on_cpu_is_a_check_error_not_a_fallback(tmp_path):
    # in this process: that a check error exits 1 with "error: ..." is tests/test_run.py's
    cfg = compose_config(["optimizer=lamb", "optimizer.fused=true", "trainer.accelerator=cpu"])
    with pytest.raises(ConfigError, match=r"optimizer.fused=true needs CUDA and Triton") as error:
        run(cfg, run_dir=tmp_path)
    assert "use optimizer.fused=false" in str(error.value)


def test_large_batch_preset_scales_the_learning_rate_linearly(train):
    # one step of the batch of 128: the learning rate is decided before it
    summary, _ = train(
        "experiment=large_batch",
        "data.batch_size=128",
        "data.train_samples=128",
        "trainer.max_epochs=1",
    )
    assert summary["optimizer"]["lr"] == pytest.approx(2.0e-3 * 128 / 256)
    assert summary["plugins"]["large_batch"]["name"] == "lamb"


@pytest.mark.parametrize("optimizer", ["lamb", "lars"])
def test_compiled_model_trains_with_a_large_batch_optimizer_on_cpu(train, optimizer):
    """compile=on with LAMB/LARS (reference path here; fused and inductor: tests/gpu/)."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    summary, _ = train(
        "model=mlp",
        "model.hidden=[16]",
        "data.image_size=8",
        "data.batch_size=16",
        "data.train_samples=64",
        "data.val_samples=16",
        "trainer.max_steps=3",
        "trainer.enable_progress_bar=false",
        f"optimizer={optimizer}",
        "compile=on",
        "compile.backend=aot_eager",
        "trainer.accelerator=cpu",
        tiny=False,
    )
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1  # it really compiled
    assert summary["status"] == "ok"
    assert summary["optimizer"]["implementation"] == "reference"


# --- kernels.backend=liger ---------------------------------------------------------------------


def test_liger_backend_on_cpu_is_a_check_error_naming_cuda_and_the_alternative(tmp_path):
    cfg = compose_config(
        [
            *GPT,
            "kernels=[linear_cross_entropy]",
            "kernels.backend=liger",
            "kernels.ops.linear_cross_entropy.chunk_size=64",
            "trainer.accelerator=cpu",
        ],
        tiny=False,
    )
    with pytest.raises(ConfigError) as error:
        run(cfg, run_dir=tmp_path)
    message = str(error.value)
    assert (
        "kernels.backend=liger runs Liger-Kernel's Triton kernels, which need a CUDA GPU" in message
    )
    assert "this run is on cpu: use kernels.backend=tuneup" in message
    assert "chunk_size=64 sets tuneup's chunks; Liger-Kernel picks its own" in message


def test_liger_backend_without_liger_installed_says_how_to_install(monkeypatch):
    from tuneup.plugins.kernels import liger

    monkeypatch.setattr(liger, "version", lambda: None)
    missing, _ = liger.problems("cpu")
    assert "liger-kernel is not installed: pip install 'tuneup[liger]'" in missing
    assert liger.problems("cuda") == [missing]


def test_unknown_backend_lists_the_backends(tmp_path):
    cfg = compose_config(["kernels=[cross_entropy]", "kernels.backend=apex"])
    with pytest.raises(
        ConfigError,
        match=r"kernels.backend='apex' is not allowed: expected one of "
        r"'tuneup', 'liger'",
    ):
        run(cfg, run_dir=tmp_path)
