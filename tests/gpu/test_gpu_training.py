"""Training on a CUDA GPU: what a run does differently there than in the CPU tests.

The tests marked ``gpu`` are skipped, saying why, where torch sees no CUDA device
(tests/conftest.py); bench/gpu.sh runs them on a lent GPU. A CPU test elsewhere that pins
``trainer.accelerator=cpu`` has its CUDA counterpart here.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.test_cudnn_benchmark import FlagSpy
from tests.test_dataloader import LoaderSpy
from tuneup import hookimpl
from tuneup.plugins.precision.choices import CHOICES
from tuneup.trainer.state.divergence import Diverged

GPU = "trainer.accelerator=gpu"
#: 16 steps of 16 images 8x8 that the default model learns (as tests/test_precision.py).
LEARN = [
    "data.train_samples=256",
    "data.val_samples=64",
    "data.batch_size=16",
    "data.image_size=8",
    "data.signal=1.0",
]
#: model=mlp (no BatchNorm, no convs), 8 micro-batches of 32; pass tiny=False with it.
MLP = [
    "model=mlp",
    "model.hidden=[64]",
    "data.train_samples=256",
    "data.val_samples=128",
    "data.batch_size=32",
    "trainer.max_epochs=1",
    "trainer.enable_progress_bar=false",
    "trainer.log_every_n_steps=1",
]


def ampere() -> bool:
    """bfloat16 and TF32 tensor cores (compute capability 8.0 or later)."""
    return torch.cuda.get_device_capability() >= (8, 0)


def final_weights(run_dir) -> dict[str, torch.Tensor]:
    newest = max((run_dir / "checkpoints").glob("*.ckpt"))  # names sort by epoch and step
    return torch.load(newest, map_location="cpu", weights_only=False)["state_dict"]


def assert_weights_close(got: dict, expected: dict, rtol: float, atol: float) -> None:
    assert got.keys() == expected.keys()
    for name, value in expected.items():
        torch.testing.assert_close(got[name], value, rtol=rtol, atol=atol, msg=name)


# --- precision: dtypes, scaler, TF32 -----------------------------------------------------


class Probe:
    """What convs and linears compute in, on which device, whether a loss scaler runs, TF32."""

    def __init__(self) -> None:
        self.outputs, self.weights, self.devices = set(), set(), set()
        self.scaler = self.tf32 = None

    @hookimpl
    def on_fit_start(self, module):
        for layer in module.model.modules():
            if isinstance(layer, (nn.Conv2d, nn.Linear)):
                layer.register_forward_hook(self._record)

    def _record(self, layer, inputs, output):
        self.outputs.add(output.dtype)
        self.weights.add(layer.weight.dtype)
        self.devices.add(output.device.type)

    @hookimpl
    def on_train_batch_start(self, trainer):
        self.scaler = getattr(trainer.precision_plugin, "scaler", None) is not None
        self.tf32 = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)


def expected_on_this_gpu(name: str):
    """(conv/linear output dtype, weight dtype, loss scaler?) of precision=name here."""
    f32, f16, bf16 = torch.float32, torch.float16, torch.bfloat16
    amp = (bf16, f32, False) if ampere() else (f16, f32, True)
    return {
        "fp32": (f32, f32, False),
        "tf32": (f32, f32, False),
        "fp16": (f16, f32, True),
        "bf16": (bf16, f32, False),
        "amp": amp,
        "fp16-true": (f16, f16, False),
        "bf16-true": (bf16, bf16, False),
    }[name]


@pytest.mark.gpu
@pytest.mark.parametrize("name", [c for c in CHOICES if c != "fp8"])  # fp8: test_gpu_fp8.py
def test_choice_computes_in_its_dtype_on_the_gpu_with_a_scaler_only_for_fp16(
    name, train, add_plugin
):
    if name.startswith("bf16") and not ampere():
        pytest.skip(f"precision={name} needs compute capability >= 8.0 (a check error here)")
    probe = add_plugin(Probe())
    summary, _ = train(GPU, f"precision={name}", *LEARN)
    output_dtype, weight_dtype, scaled = expected_on_this_gpu(name)
    assert probe.devices == {"cuda"}
    assert probe.outputs == {output_dtype} and probe.weights == {weight_dtype}
    assert probe.scaler is scaled
    assert (summary["precision"]["loss_scale"] is not None) is scaled
    assert summary["val"]["acc"] >= 0.2  # twice chance: it trains
    if name == "amp":
        assert summary["precision"]["ran_as"] == ("bf16" if ampere() else "fp16")


@pytest.fixture
def tf32_flags():
    """Start from matmul "medium" and cuDNN TF32 off; put torch's state back after."""
    saved = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    torch.set_float32_matmul_precision("medium")
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.set_float32_matmul_precision(saved[0])
    torch.backends.cudnn.allow_tf32 = saved[1]


@pytest.mark.gpu
@pytest.mark.parametrize(("name", "during"), [("tf32", (True, True)), ("fp32", (False, False))])
def test_tf32_flags_are_set_during_the_gpu_run_and_restored_after(
    name, during, tf32_flags, train, add_plugin
):
    if name == "tf32" and not ampere():
        pytest.skip("TF32 needs compute capability >= 8.0 (the run is fp32 there, and says so)")
    probe = add_plugin(Probe())
    summary, _ = train(GPU, f"precision={name}", "trainer.max_steps=3")
    assert probe.tf32 == during
    assert summary["precision"]["ran_as"] == name and summary["precision"]["note"] is None
    assert torch.get_float32_matmul_precision() == "medium"
    assert torch.backends.cudnn.allow_tf32 is False


# --- memory format, cuDNN, data loading, profiler ----------------------------------------


class ConvLayouts:
    """Whether each convolution's input and weight are channels_last, and on which device."""

    def __init__(self) -> None:
        self.inputs, self.weights, self.devices = set(), set(), set()

    @hookimpl
    def on_fit_start(self, module):
        for layer in module.model.modules():
            if isinstance(layer, nn.Conv2d):
                layer.register_forward_hook(self._record)

    def _record(self, layer, inputs, output):
        self.inputs.add(inputs[0].is_contiguous(memory_format=torch.channels_last))
        self.weights.add(layer.weight.is_contiguous(memory_format=torch.channels_last))
        self.devices.add(inputs[0].device.type)


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "amp"])
def test_channels_last_inputs_reach_every_conv_on_the_gpu(train, add_plugin, precision):
    layouts = add_plugin(ConvLayouts())
    summary, _ = train(
        GPU, "memory_format=channels_last", f"precision={precision}", "trainer.max_steps=3"
    )
    assert layouts.devices == {"cuda"}
    assert layouts.inputs == {True} and layouts.weights == {True}
    assert summary["status"] == "ok"


@pytest.mark.gpu
def test_cudnn_benchmark_is_on_during_the_gpu_run_and_restored_after(
    train, add_plugin, monkeypatch
):
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    flags = add_plugin(FlagSpy())
    summary, _ = train(GPU, "cudnn_benchmark=on", "trainer.max_steps=2")
    assert flags.during == [True, True] and torch.backends.cudnn.benchmark is False
    assert summary["plugins"]["cudnn_benchmark"] == {"name": "on"}  # no "none on cpu" note


@pytest.mark.gpu
def test_workers_pin_memory_for_the_gpu(train, add_plugin):
    spy = add_plugin(LoaderSpy())
    summary, _ = train(GPU, "dataloader=workers", "dataloader.num_workers=2")
    assert spy.used == (2, True, True)  # pinned: pin_memory=auto pins on CUDA
    assert summary["plugins"]["dataloader"]["pin_memory"] is True


@pytest.mark.gpu
def test_profiler_reports_the_top_cuda_operators(train):
    summary, run_dir = train(
        GPU,
        *MLP,
        "profiler=on",
        "profiler.wait=2",
        "profiler.warmup=1",
        "profiler.active=2",
        "profiler.top_k=5",
        tiny=False,
    )
    report = summary["profiler"]
    assert report["profiled_steps"] == 2 and (run_dir / "profiler" / "trace.json").is_file()
    top_cuda = report["top_ops_self_cuda_ms"]
    assert 0 < len(top_cuda) <= 5 and all(ms > 0 for ms in top_cuda.values())


# --- measurement: CUDA events, deferred NaN check, device figures, MFU -------------------


class Phase:
    """Marks when training is over (report() drains the timing events after that)."""

    def __init__(self) -> None:
        self.training = False

    @hookimpl
    def on_fit_start(self):
        self.training = True

    @hookimpl
    def on_fit_end(self):
        self.training = False


@pytest.mark.gpu
def test_step_times_come_from_cuda_events_never_waited_for_during_training(
    train, add_plugin, monkeypatch
):
    phase, created, waited_in_training = add_plugin(Phase()), [], []

    class RecordedEvent(torch.cuda.Event):
        def __new__(cls, *args, **kwargs):
            event = super().__new__(cls, *args, **kwargs)
            created.append(event)
            return event

        def synchronize(self):
            waited_in_training.append(phase.training)
            return super().synchronize()

    monkeypatch.setattr(torch.cuda, "Event", RecordedEvent)
    summary, _ = train(GPU)  # TINY: 8 micro-batches, the first 2 are warm-up
    assert len(created) >= 16  # two per micro-batch: its start and its end
    assert not any(waited_in_training)  # read with query() while training, waited for after
    times = summary["step_time_ms"]
    assert times["count"] == 6 and 0 < times["p50"] <= times["p90"]
    assert 0 <= summary["data_wait_fraction"] < 1  # GPU time between batches / step time


class NanInput:
    """Makes the inputs of training micro-batch `at` NaN; notes the micro-batches started."""

    def __init__(self, at: int) -> None:
        self.at, self.transformed, self.started = at, 0, []

    @hookimpl
    def transform_batch(self, batch):
        self.transformed += 1
        if self.transformed - 1 == self.at:
            x, y = batch
            return type(batch)([torch.full_like(x, float("nan")), y])
        return None

    @hookimpl
    def on_train_batch_start(self, batch_idx):
        self.started.append(batch_idx)


@pytest.mark.parametrize(
    ("accelerator", "started"),
    [
        pytest.param("cpu", [0, 1, 2], id="cpu-at-once"),
        pytest.param("gpu", [0, 1, 2, 3, 4], id="gpu-deferred", marks=pytest.mark.gpu),
    ],
)
def test_a_nan_loss_is_caught_naming_its_step_on_cuda_at_the_logging_interval(
    make_config, tmp_path, add_plugin, accelerator, started
):
    """CPU reads the loss at once; CUDA keeps the check on the device until the logging step
    (every 5 micro-batches here), so two more steps run, and the message names step 3."""
    from tuneup.trainer.runner import run

    nan = add_plugin(NanInput(at=2))
    cfg = make_config([*MLP, f"trainer.accelerator={accelerator}"], tiny=False)
    cfg.trainer.log_every_n_steps = 5
    with pytest.raises(Diverged, match=r"the loss was nan in step 3 \(epoch 0, batch 2"):
        run(cfg, run_dir=tmp_path)
    assert nan.started == started


@pytest.mark.gpu
def test_summary_names_the_gpu_its_allocator_peak_and_mfu(train, cuda_peak):
    summary, _ = train(GPU, "trainer.max_epochs=2")
    assert summary["device"] == torch.cuda.get_device_name() and summary["world_size"] == 1
    total = torch.cuda.get_device_properties(0).total_memory
    assert 0 < summary["peak_memory_bytes"] < total  # the CUDA allocator's, not the RSS
    assert summary["peak_tflops"] == cuda_peak
    expected = summary["flops_per_sample"] * summary["samples_per_s"] / 1e12
    assert summary["achieved_tflops"] == pytest.approx(expected)
    assert summary["mfu"] == pytest.approx(expected / cuda_peak)
    assert 0 < summary["mfu"] < 1


# --- compile, activation checkpointing ---------------------------------------------------


@pytest.mark.gpu
def test_compile_on_trains_like_eager_on_the_gpu(train, tmp_path):
    torch._dynamo.reset()  # compile this run's model afresh: compile_seconds is then > 0
    eager, eager_dir = train(GPU, *MLP, tiny=False, run_dir=tmp_path / "eager")
    compiled, compiled_dir = train(
        GPU, *MLP, "compile=on", tiny=False, run_dir=tmp_path / "compiled"
    )
    assert compiled["compile_seconds"] > 0 and compiled["plugins"]["compile"]["name"] == "on"
    # fp32 with TF32 off in both; inductor's fused kernels round differently, not more
    assert_weights_close(final_weights(compiled_dir), final_weights(eager_dir), 1e-4, 1e-5)
    assert compiled["val"]["loss"] == pytest.approx(eager["val"]["loss"], rel=1e-3)


@pytest.mark.gpu
def test_activation_checkpointing_saves_40_percent_and_trains_alike_on_the_gpu(
    train, tmp_path, monkeypatch
):
    """Bitwise equality, asserted on CPU, does not hold on CUDA: cuDNN's algorithms may add in
    another order from one call to the next. With deterministic cuDNN the runs agree to
    1e-4 relative after 8 steps."""
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)
    runs = {}
    for choice in ("off", "blocks"):
        summary, run_dir = train(
            GPU, f"activation_checkpointing={choice}", "model.width=16", run_dir=tmp_path / choice
        )
        runs[choice] = summary, final_weights(run_dir)
    (off, off_state), (on, on_state) = runs["off"], runs["blocks"]
    assert on["saved_activation_bytes"] <= 0.6 * off["saved_activation_bytes"]
    assert_weights_close(on_state, off_state, rtol=1e-4, atol=1e-6)


@pytest.mark.gpu
def test_selective_checkpointing_saves_40_percent_on_a_gpt_and_trains_alike(train, tmp_path):
    """amp on CUDA: matmul and flash-attention outputs kept, the rest recomputed."""
    gpt = [
        "model=gpt",
        "data=synthetic_tokens",
        "data.vocab_size=512",
        "data.context=128",
        "model.width=128",
        "model.layers=4",
        "model.heads=4",
        "data.train_samples=256",
        "data.batch_size=16",
        "trainer.max_epochs=1",
        "++trainer.limit_val_batches=0",
        "trainer.enable_progress_bar=false",
        "precision=amp",
    ]
    runs = {}
    for choice in ("off", "selective"):
        summary, run_dir = train(
            GPU, *gpt, f"activation_checkpointing={choice}", tiny=False, run_dir=tmp_path / choice
        )
        runs[choice] = summary, final_weights(run_dir)
    (off, off_state), (selective, state) = runs["off"], runs["selective"]
    assert selective["saved_activation_bytes"] <= 0.6 * off["saved_activation_bytes"]
    assert_weights_close(state, off_state, rtol=1e-3, atol=1e-5)
