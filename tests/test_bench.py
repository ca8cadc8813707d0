"""The benchmark scripts' set-up, on CPU (they measure on a GPU: bench/gpu.sh, docs/benchmarks.md)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT, bench_module


def test_precision_bench_data_do_not_grow_with_the_steps():
    """50 steps at batch 256 generated 12,800 ResNet-50 images per run, and the default CUDA
    run did not finish in 5 minutes: the runs now cycle over at most 10 batches."""
    precision = bench_module("precision")
    args = precision.parse(["--device", "cuda", "--steps", "500"])
    assert args.batch_size == 256 and args.model == "resnet50"
    run = precision.overrides(args, "fp32", Path("run"))
    assert "data.train_samples=2560" in run  # 10 batches
    assert "trainer.max_steps=500" in run and "trainer.max_epochs=-1" in run


def test_precision_bench_prints_every_choice_and_exits_1_when_one_failed(monkeypatch, capsys):
    """bench/gpu.sh counts a benchmark as failed by its exit code."""
    precision = bench_module("precision")

    def run_one(args, choice, run_dir):
        if choice == "bf16":
            return {"choice": choice, "error": "RuntimeError: out of memory"}
        return {"choice": choice, "ran_as": choice, "samples_per_s": 100.0, "note": None,
                "peak_memory_bytes": 2**30, "data_wait_fraction": 0.01, "device": "cpu"}  # fmt: skip

    monkeypatch.setattr(precision, "run_one", run_one)
    with pytest.raises(SystemExit) as exit_:
        precision.main(["--device", "cpu", "--choices", "fp32,bf16"])
    assert exit_.value.code == 1
    rows = {line.split("|")[1].strip(): line for line in capsys.readouterr().out.splitlines()
            if line.startswith("| ") and not line.startswith("| precision")}  # fmt: skip
    assert "| 100.0 |" in rows["fp32"] and "failed: RuntimeError: out of memory" in rows["bf16"]


def test_gpu_script_lists_every_step_and_refuses_unknown_ones():
    listed = subprocess.run(["bash", str(ROOT / "bench" / "gpu.sh"), "--list"],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    steps = [line.split(":")[0] for line in listed.stdout.splitlines()]
    assert steps == ["gpu-tests", "suite", "throughput", "precision", "memory", "kernels",
                     "dataloader"]  # fmt: skip
    unknown = subprocess.run(["bash", str(ROOT / "bench" / "gpu.sh"), "nope"],
                             capture_output=True, text=True, timeout=60)  # fmt: skip
    assert unknown.returncode == 2 and "unknown step 'nope'" in unknown.stderr
