"""Precision: each choice computes in its dtype, fp16's scaler skips bad steps, tf32 flags return."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from pytorch_lightning.plugins.precision import HalfPrecision
from torch import nn

import tuneup.trainer.runner as runner
from tuneup import TuneupError, hookimpl
from tuneup.plugins.precision import Plugin
from tuneup.plugins.precision.choices import CHOICES, Choice, resolve
from tuneup.plugins.precision.scaling import ScaledPrecision, sharded_precision
from tuneup.plugins.strategy.parallelize import Settings
from tuneup.trainer.environment import Environment

#: 16 steps of 16 images 8x8 (fp16 is slow on CPU): the default model learns the classes.
LEARN = [
    "data.train_samples=256",
    "data.val_samples=64",
    "data.batch_size=16",
    "data.image_size=8",
    "data.signal=1.0",
]
#: 8 optimizer steps, no validation: for runs that only look at the steps.
STEPS = [
    "data.train_samples=128",
    "data.batch_size=16",
    "data.image_size=8",
    "++trainer.limit_val_batches=0",
]
SCALER = ["precision=fp16", "precision.init_scale=1024", "precision.backoff_factor=0.25"]

CPU = Environment("cpu", 1, 1, "cpu", None, True, "avx512_bf16")
OLD_CPU = Environment("cpu", 1, 1, "cpu", None, True, None)  # bfloat16 only emulated
V100 = Environment("cuda", 1, 1, "Tesla V100", (7, 0), False)
A100 = Environment("cuda", 1, 1, "NVIDIA A100", (8, 0), True, "bfloat16 tensor cores")

#: On CPU: (dtype of conv/linear outputs, dtype of their weights) for each choice.
EXPECTED = {
    "fp32": (torch.float32, torch.float32),
    "tf32": (torch.float32, torch.float32),
    "fp16": (torch.float16, torch.float32),
    "bf16": (torch.bfloat16, torch.float32),
    "amp": (torch.bfloat16, torch.float32),  # CPU autocast supports bfloat16
    "fp16-true": (torch.float16, torch.float16),
    "bf16-true": (torch.bfloat16, torch.bfloat16),
}


class Probe:
    """A test plugin: what the loop computes in, which steps changed the weights; injects inf."""

    def __init__(self, inf_at=(), fail_at=None) -> None:
        self.inf_at, self.fail_at = set(inf_at), fail_at
        self.outputs, self.weights, self.losses = set(), set(), set()
        self.changed: dict[int, bool] = {}  # optimizer step -> did the weights change
        self.scales: dict[int, float] = {}  # optimizer step -> loss scale after it
        self.tf32 = self.first_scale = self.scheduler_steps = None

    @hookimpl
    def on_fit_start(self, module):
        for layer in module.model.modules():
            if isinstance(layer, (nn.Conv2d, nn.Linear)):
                layer.register_forward_hook(self._record)

    def _record(self, layer, inputs, output):
        self.outputs.add(output.dtype)
        self.weights.add(layer.weight.dtype)

    @hookimpl
    def on_train_batch_start(self, trainer, module):
        self.tf32 = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        if self.first_scale is None and scaler is not None:
            self.first_scale = scaler.get_scale()
        if trainer.global_step == self.fail_at:
            raise RuntimeError("probe: failing on purpose")
        self.before = _flat(module)

    @hookimpl
    def on_after_backward(self, trainer, module):
        if trainer.global_step in self.inf_at:
            next(module.parameters()).grad.fill_(float("inf"))

    @hookimpl
    def on_train_batch_end(self, trainer, module, outputs):
        step = trainer.global_step - 1  # the step just taken
        self.losses.add(outputs["loss"].dtype)
        self.changed[step] = not torch.equal(self.before, _flat(module))
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        if scaler is not None:
            self.scales[step] = scaler.get_scale()

    @hookimpl
    def on_fit_end(self, trainer):
        self.scheduler_steps = trainer.lr_scheduler_configs[0].scheduler.last_epoch


def last_checkpoint(run_dir: Path) -> Path:
    return sorted((run_dir / "checkpoints").glob("*.ckpt"))[-1]


def _flat(module) -> torch.Tensor:
    return torch.cat([p.detach().float().flatten() for p in module.parameters()])


@pytest.fixture
def probe(add_plugin):
    """``probe(**kwargs)``: runs started in this test also register a :class:`Probe`."""
    return lambda **kwargs: add_plugin(Probe(**kwargs))


# --- each choice computes in its dtype and trains ---------------------------------------


@pytest.mark.parametrize("name", [c for c in CHOICES if c != "fp8"])  # fp8: tests/test_fp8.py
def test_choice_computes_in_its_dtype_and_learns(name, train, probe):
    spy = probe()
    summary, _ = train(f"precision={name}", *LEARN, "trainer.accelerator=cpu")  # GPU: tests/gpu/
    output_dtype, weight_dtype = EXPECTED[name]
    assert spy.outputs == {output_dtype}, "conv/linear outputs"
    assert spy.weights == {weight_dtype}, "conv/linear weights"
    assert spy.losses == {torch.float32}
    assert summary["val"]["acc"] >= 0.2  # twice chance (10 classes)
    assert summary["precision"]["weights_dtype"] == str(weight_dtype).removeprefix("torch.")


def test_fp16_on_cpu_is_fp16_with_a_scaler_not_bf16(train):
    summary, _ = train(*SCALER, *STEPS, "trainer.accelerator=cpu")
    assert summary["precision"]["ran_as"] == "fp16"
    assert summary["precision"]["autocast_dtype"] == "float16"
    assert summary["precision"]["skipped_steps"] == 0
    assert summary["precision"]["loss_scale"] == 1024


# --- fp16: a step with inf gradients is skipped ------------------------------------------


def test_inf_gradient_skips_that_step_backs_off_and_training_goes_on(train, probe):
    spy = probe(inf_at={3})
    summary, run_dir = train(*SCALER, *STEPS)
    assert summary["steps"] == 8
    assert spy.changed == {step: step != 3 for step in range(8)}
    assert spy.scales[2] == 1024 and spy.scales[3] == 1024 * 0.25
    assert summary["precision"]["skipped_steps"] == 1
    assert summary["precision"]["loss_scale"] == 256
    assert spy.scheduler_steps == 7, "the LR schedule must not advance on the skipped step"

    # The scaler's state is in the checkpoint, next to the skipped-step count.
    checkpoint = torch.load(last_checkpoint(run_dir), map_location="cpu", weights_only=True)
    assert checkpoint["CountingMixedPrecision"]["scale"] == 256
    assert checkpoint["tuneup"]["precision"] == {"skipped_steps": 1}


def test_resume_restores_the_scaler_state(tmp_path, train, probe):
    probe(inf_at={0})
    first, run_dir = train(*SCALER, *STEPS)
    assert first["precision"]["loss_scale"] == 256
    spy = probe()
    resumed, _ = train(
        *SCALER,
        *STEPS,
        "trainer.max_epochs=2",
        f"resume={last_checkpoint(run_dir)}",
        run_dir=tmp_path / "resumed",
    )
    assert resumed["steps"] == 16
    assert spy.first_scale == 256, "a fresh scaler would start at init_scale=1024"
    assert resumed["precision"]["skipped_steps"] == 1


def test_too_many_skips_in_a_row_stop_the_run_naming_step_and_scale(train, probe):
    probe(inf_at=set(range(8)))
    with pytest.raises(TuneupError, match=r"3 optimizer steps in a row .* global step 2.* 16\b"):
        train(*SCALER, *STEPS, "precision.max_consecutive_skips=3")


# --- tf32 flags ---------------------------------------------------------------------------


@pytest.fixture
def tf32_flags():
    """Start from a non-default state (matmul "medium", cuDNN TF32 off); put torch's back after."""
    saved = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    torch.set_float32_matmul_precision("medium")
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.set_float32_matmul_precision(saved[0])
    torch.backends.cudnn.allow_tf32 = saved[1]


@pytest.mark.parametrize(("name", "during"), [("tf32", (True, True)), ("fp32", (False, False))])
def test_tf32_flags_are_set_during_the_run_and_restored_after(
    name, during, tf32_flags, train, probe
):
    spy = probe()
    summary, _ = train(f"precision={name}", *STEPS, "trainer.accelerator=cpu")  # GPU: tests/gpu/
    assert spy.tf32 == during
    assert torch.get_float32_matmul_precision() == "medium"
    assert torch.backends.cudnn.allow_tf32 is False
    if name == "tf32":
        assert summary["precision"]["note"] == "tf32 not available on cpu: ran as fp32"
        assert summary["precision"]["ran_as"] == "fp32"


def test_tf32_flags_are_restored_when_the_run_fails(tf32_flags, train, probe):
    spy = probe(fail_at=2)
    with pytest.raises(Exception, match="failing on purpose"):
        train("precision=tf32", *STEPS)
    assert spy.tf32 == (True, True)
    assert torch.get_float32_matmul_precision() == "medium"
    assert torch.backends.cudnn.allow_tf32 is False


# --- config and machine checks -----------------------------------------------------------


def test_unknown_choice_exits_1_naming_the_choices(cli):
    result = cli("precision=fp64")
    assert result.returncode == 1
    assert result.stderr.startswith(
        "error: precision=fp64 is not an option of precision; its "
        f"options are: {', '.join(sorted(CHOICES))}"
    )


def test_bad_scaler_settings_are_all_reported(make_config):
    cfg = make_config(
        [
            "precision=fp16",
            "precision.init_scale=0",
            "precision.growth_factor=1.0",
            "precision.backoff_factor=1.5",
            "precision.growth_interval=0",
            "precision.max_consecutive_skips=0",
        ]
    )
    found = "\n".join(Plugin(cfg).check(cfg, CPU, None))
    for key in (
        "init_scale=0",
        "growth_factor=1.0",
        "backoff_factor=1.5",
        "growth_interval=0",
        "max_consecutive_skips=0",
    ):
        assert f"precision.{key} is not allowed" in found


def test_lightning_precision_argument_conflicts(make_config):
    cfg = make_config(["precision=bf16", "+trainer.precision=16-mixed"])
    (found,) = Plugin(cfg).check(cfg, CPU, None)
    assert "trainer.precision=16-mixed conflicts with precision=bf16" in found


def test_bf16_on_a_gpu_without_bf16_is_a_problem_not_a_swap(make_config):
    cfg = make_config(["precision=bf16"])
    (found,) = Plugin(cfg).check(cfg, V100, None)
    assert "Tesla V100 (compute capability 7.0)" in found and "precision=amp" in found


@pytest.mark.parametrize(
    ("env", "ran_as", "why"),
    [
        (CPU, "bf16", "cpu autocast supports bfloat16, in hardware here (avx512_bf16)"),
        (
            OLD_CPU,
            "fp32",
            "cpu without bfloat16 hardware (no amx_bf16, avx512_bf16, bf16): "
            "half precision would be emulated, slower than fp32; ran as fp32",
        ),
        (A100, "bf16", "NVIDIA A100 (compute capability 8.0) supports bfloat16"),
        (V100, "fp16", "no bfloat16 on Tesla V100 (compute capability 7.0): float16 with loss"),
    ],
)
def test_amp_chooses_the_fastest_safe_half_type_here_and_says_why(env, ran_as, why):
    choice = resolve("amp", env)
    assert choice.ran_as == ran_as and choice.why.startswith(why)
    assert choice.scaled == (ran_as == "fp16")


def test_plugin_listing_shows_what_amp_chose_and_why(make_config, capsys):
    cfg = make_config(["precision=amp", "plugins.list=true", "trainer.accelerator=cpu"])
    runner.run(cfg, run_dir=None)
    out = capsys.readouterr().out
    expected = resolve("amp", Environment.from_config(cfg))  # this CPU: bf16 hardware or not
    assert f"'ran_as': '{expected.ran_as}'" in out and f"'why': '{expected.why}'" in out


def test_tf32_without_tf32_hardware_runs_as_fp32_and_says_so():
    assert resolve("tf32", V100).why == (
        "tf32 not available on Tesla V100 (compute capability 7.0): ran as fp32"
    )
    assert resolve("tf32", A100) == Choice("tf32", "tf32")


def test_half_precision_on_cuda_warns_about_sizes_not_multiple_of_8(make_config, caplog):
    cfg = make_config(["precision=bf16", "data.batch_size=30", "model.width=12"])
    with caplog.at_level(logging.WARNING, logger="tuneup.plugins.precision"):
        assert Plugin(cfg).check(cfg, A100, None) == []
    assert "data.batch_size=30" in caplog.text and "e.g. 32" in caplog.text
    assert "model.width=12" in caplog.text and "e.g. 16" in caplog.text
    caplog.clear()
    for overrides, env in ((["precision=bf16"], CPU), (["precision=fp32"], A100)):
        cfg = make_config([*overrides, "data.batch_size=30"])
        Plugin(cfg).check(cfg, env, None)
    assert caplog.text == ""


@pytest.mark.parametrize("name", ["fp16", "bf16", "bf16-true", "fp32"])
def test_under_fsdp_mixed_precision_is_fsdp2s_policy_with_a_sharded_scaler_for_fp16(
    make_config, name
):
    cfg = make_config([f"precision={name}"])
    parallel = Settings()
    plugin = sharded_precision(resolve(name, CPU), cfg.precision, "cpu", parallel)
    if name == "fp16":  # parameters computed in fp16 by FSDP2; the scaler agrees across ranks
        assert parallel.param_dtype == torch.float16 and isinstance(plugin, ScaledPrecision)
        assert type(plugin.scaler).__name__ == "ShardedGradScaler" and plugin.scaler.is_enabled()
        assert plugin.scaler.get_scale() == cfg.precision.init_scale
        with plugin.forward_context():  # no autocast on top of the policy's casts
            assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32
    elif name == "bf16":
        assert parallel.param_dtype == torch.bfloat16 and plugin is None
    elif name == "bf16-true":  # the weights themselves are bf16: no policy
        assert parallel.param_dtype is None and isinstance(plugin, HalfPrecision)
    else:
        assert parallel.param_dtype is None and plugin is None


def test_docs_name_every_choice():
    text = (Path(__file__).resolve().parents[1] / "docs" / "precision.md").read_text()
    for name in CHOICES:
        assert f"`{name}`" in text
