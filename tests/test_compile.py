"""torch.compile: applied last, trains like eager, keeps parameter names, compile time reported apart."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import compose_config
from tuneup.plugins.compile import Plugin, first_step_overhead
from tuneup.trainer.components import Plan
from tuneup.trainer.environment import Environment

MLP = [
    "model=mlp",
    "model.hidden=[32]",
    "data.image_size=8",
    "data.train_samples=64",
    "data.val_samples=32",
    "data.batch_size=16",
    "trainer.max_epochs=1",
    "trainer.enable_progress_bar=false",
]


def final_state(run_dir) -> dict[str, torch.Tensor]:
    ckpt = max((run_dir / "checkpoints").glob("*.ckpt"))  # the newest: end of training
    return torch.load(ckpt, map_location="cpu", weights_only=False)["state_dict"]


def test_compiled_training_matches_eager_and_reports_compile_time(train, tmp_path, monkeypatch):
    import torch._dynamo
    import torch._inductor.config

    monkeypatch.setattr(torch._inductor.config, "compile_threads", 1)  # no worker pool: faster here
    # scalar C++: no SIMD probes (6 of a clean machine's 9 g++ builds) nor vector headers, 18
    # CPU-s for this test instead of 29; Inductor's vector code is torch's to test, not ours
    monkeypatch.setattr(torch._inductor.config.cpp, "vec_isa_ok", False)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    eager, eager_dir = train(*MLP, tiny=False, run_dir=tmp_path / "eager")
    compiled, compiled_dir = train(*MLP, "compile=on", tiny=False, run_dir=tmp_path / "compiled")
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1  # it really compiled
    assert compiled["plugins"]["compile"]["mode"] == "default"
    assert compiled["compile_seconds"] > 0 and "compile_seconds" not in eager
    expected, got = final_state(eager_dir), final_state(compiled_dir)
    assert got.keys() == expected.keys()  # no _orig_mod. prefix: checkpoints load either way
    for name, value in expected.items():
        torch.testing.assert_close(got[name], value, rtol=1e-4, atol=1e-5, msg=name)
    assert compiled["val"]["loss"] == pytest.approx(eager["val"]["loss"], rel=1e-4)


def test_compile_time_is_the_first_step_beyond_the_median():
    assert first_step_overhead([5.0, 0.2, 0.3, 0.1]) == pytest.approx(4.8)
    assert first_step_overhead([5.0]) is None


def test_bad_settings_are_check_errors():
    cfg = compose_config(["compile=on", "compile.mode=fastest", "compile.backend=nope"])
    found = Plugin(cfg).check(cfg, Environment.from_config(cfg), Plan(cfg))
    assert found == [
        "compile.mode='fastest' is not allowed: expected one of 'default', 'reduce-overhead', "
        "'max-autotune', 'max-autotune-no-cudagraphs'",
        "compile.backend='nope' is not allowed: expected a torch.compile backend: "
        + ", ".join(torch.compiler.list_backends())
        + " (debugging: eager, aot_eager)",
    ]


def test_cpu_without_a_cxx_compiler_is_a_check_error(monkeypatch):
    cfg = compose_config(["compile=on", "trainer.accelerator=cpu"])
    monkeypatch.setattr("shutil.which", lambda name: None)
    monkeypatch.delenv("CXX", raising=False)
    (found,) = Plugin(cfg).check(cfg, Environment.from_config(cfg), Plan(cfg))
    assert found.startswith("compile=on on CPU needs a C++ compiler (inductor generates C++)")
