"""``python bench/kernels.py --smoke``: every row the GPU run prints, at tiny sizes on CPU.

Collected only under TRITON_INTERPRET=1 (conftest.py), which is what ``--smoke`` sets before
the kernels are defined: test_triton_kernels.py runs this file in its interpreter subprocess
(under the installed Triton), beside test_interpreted_kernels.py, not in a process of its own.
"""

from __future__ import annotations

import os

from tests.conftest import bench_module


def test_smoke_run_prints_every_row_and_target(capsys):
    """Every code path of the GPU run: Liger's kernels and ours under Triton's interpreter,
    torch.compile with the eager backend."""
    assert os.environ["TRITON_INTERPRET"] == "1"
    bench_module("kernels").main(["--smoke"])
    out = capsys.readouterr().out
    for implementation in ("tuneup", "liger", "torch eager", "torch compiled"):
        for mode in ("fwd+bwd", "fwd"):
            assert f"| cross_entropy 16x100 bf16 | {implementation} | {mode} |" in out
    for implementation in ("tuneup", "liger", "torch eager unfused", "torch compiled unfused"):
        for mode in ("fwd+bwd", "fwd"):
            assert f"| linear_cross_entropy 24x8->50 bf16 | {implementation} | {mode} |" in out
    assert "| tuneup chunk_size=8 | fwd+bwd |" in out
    assert "two passes of 4096, 8 warps, 2 per SM looping over rows" in out
    for optimizer in ("Lamb", "Lars"):
        for variant in (
            "tuneup fused (Triton)",
            "eager per-parameter",
            "torch._foreach",
            "torch.compile of the eager loop",
        ):
            assert f"{optimizer} step, 21 tensors, 0M fp32 | {variant} | step |" in out
    for variant in ("bf16", "float8 tensorwise", "float8 rowwise"):
        assert f"| linear 32x16->32 | {variant} | fwd+bwd |" in out
    assert out.count("| n/a (smoke) |") == 8  # the targets, checked on a GPU
