"""The Triton kernels without a GPU: compiled for an H200, and run by Triton's interpreter.

Compiling to a cubin for sm_90 catches what the interpreter forgives (types of loop-carried
values, pointer casts, register spills into errors). The interpreter tests run in a subprocess
because TRITON_INTERPRET=1 must be set before plugins.kernels is imported.
"""

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import triton  # the optional extra must be installed for these tests: fail, never skip
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from tuneup.plugins.kernels import triton_on_cpu  # noqa: F401  (imports the kernels)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
H200 = GPUTarget("cuda", 90, 32)

support = importlib.import_module("tuneup.plugins.kernels.triton_support")
ce_module = importlib.import_module("tuneup.plugins.kernels.cross_entropy")
lamb_module = importlib.import_module("tuneup.plugins.kernels.lamb")
lars_module = importlib.import_module("tuneup.plugins.kernels.lars")


def test_kernels_under_the_triton_interpreter():
    command = [sys.executable, "-m", "pytest", str(HERE / "test_interpreted_kernels.py")]
    result = subprocess.run(
        [*command, "-q", "-x", "-p", "no:cacheprovider"],
        cwd=ROOT,
        env={**os.environ, "TRITON_INTERPRET": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-8000:] + result.stderr[-4000:]
    assert " passed" in result.stdout


MULTI_TENSOR = dict(
    addresses="*i64",
    numels="*i64",
    excluded="*i64",
    chunks="*i64",
    norms="*fp32",
    grad_scale_ptr="*fp32",
    found_inf_ptr="*fp32",
    param_like="*bf16",
    grad_like="*bf16",
)
FLAGS = dict(HAS_GRAD_SCALE=True, HAS_FOUND_INF=True, CHUNK=16384, BLOCK=1024)
HYPER = {name: "fp32" for name in ("beta1", "beta2", "eps", "weight_decay")}


def kernels_and_signatures():
    """(name, kernel, runtime argument types, constexpr values, warps) as the ops launch them."""
    ce_args = dict(
        logits_ptr="*bf16",
        logits_row_stride="i64",
        target_ptr="*i64",
        grad_ptr="*bf16",
        grad_row_stride="i64",
        row_loss_ptr="*fp32",
        n_valid_ptr="*i64",
        n_classes="i32",
        ignore_index="i32",
        label_smoothing="fp32",
    )
    lars_hyper = {n: "fp32" for n in ("lr", "momentum", "weight_decay", "trust_coefficient", "eps")}
    return [
        (
            "cross_entropy one pass",
            ce_module._cross_entropy_rows_kernel,
            ce_args,
            dict(COMPUTE_GRAD=True, ONE_PASS=True, BLOCK=ce_module.MAX_ONE_PASS),
            32,
        ),
        (
            "cross_entropy two passes",
            ce_module._cross_entropy_rows_kernel,
            ce_args,
            dict(COMPUTE_GRAD=True, ONE_PASS=False, BLOCK=ce_module.MAX_BLOCK),
            8,
        ),
        (
            "cross_entropy loss only",
            ce_module._cross_entropy_rows_kernel,
            ce_args,
            dict(COMPUTE_GRAD=False, ONE_PASS=False, BLOCK=ce_module.MAX_BLOCK),
            8,
        ),
        ("lamb moments", lamb_module._lamb_moments_kernel, {**MULTI_TENSOR, **HYPER}, FLAGS, 4),
        (
            "lamb update",
            lamb_module._lamb_update_kernel,
            {**MULTI_TENSOR, **HYPER, "lr": "fp32", "trust_clip": "fp32"},
            {"HAS_TRUST_CLIP": True, **FLAGS},
            4,
        ),
        ("lars norms", lars_module._lars_norms_kernel, MULTI_TENSOR, FLAGS, 4),
        ("lars update", lars_module._lars_update_kernel, {**MULTI_TENSOR, **lars_hyper}, FLAGS, 4),
    ]


@pytest.mark.parametrize(
    ("kernel", "arguments", "constants", "warps"),
    [case[1:] for case in kernels_and_signatures()],
    ids=[case[0] for case in kernels_and_signatures()],
)
def test_kernel_compiles_for_h200(kernel, arguments, constants, warps):
    if support.INTERPRETED:
        pytest.skip("kernels were defined for the interpreter (TRITON_INTERPRET=1)")
    signature = {**arguments, **dict.fromkeys(constants, "constexpr")}
    source = ASTSource(fn=kernel, signature=signature, constexprs=constants)
    compiled = triton.compile(
        source, target=H200, options={"num_warps": warps, "enable_fp_fusion": True}
    )
    assert compiled.asm["cubin"]
