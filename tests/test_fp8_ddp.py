"""precision=fp8 under strategy=ddp: two CPU processes (gloo), float8 emulated (precision.emulate).

DDP replicates the converted model and all-reduces the fp32 gradients of the float8 layers as
of any other; on a GPU the matmuls are real float8 (tests/gpu/test_gpu_fp8.py)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_cli
from tests.test_fp8 import GPT_RUN

pytest.importorskip("torchao", reason="the fp8 extra (torchao) is part of the test extra")


#: GPT_RUN shortened to 2 optimizer steps of 2 x 8 samples and a validation batch a process:
#: training under DDP is shown as well as by 4 steps and 2 (0.5 CPU-s less).
SHORT = [a for a in GPT_RUN if not a.startswith(("data.train_samples", "data.val_samples"))]
SHORT += ["data.train_samples=32", "data.val_samples=16"]


def test_emulated_fp8_trains_under_ddp_with_two_processes(tmp_path):
    run_dir = tmp_path / "ddp"
    result = run_cli(
        *SHORT,
        "precision=fp8",
        "precision.emulate=true",
        "strategy=ddp",
        "trainer.devices=2",
        "data.batch_size=8",
        f"hydra.run.dir={run_dir}",
        cwd=tmp_path,
        tiny=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["plugins"]["strategy"]["used"] == "ddp"
    assert len(summary["precision"]["fp8"]["converted"]) == 7
    assert summary["status"] == "ok" and summary["steps"] == 2
