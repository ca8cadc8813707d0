"""The Triton kernels without a GPU: compiled for an H200, and run by Triton's interpreter.

Compiling to a cubin for sm_90 catches what the interpreter forgives (types of loop-carried
values, pointer casts, register spills into errors). The interpreter tests run in a subprocess
because TRITON_INTERPRET=1 must be set before plugins.kernels is imported; they run twice,
under the installed Triton and under the oldest one the ``kernels`` extra allows (pip installs
it into pytest's cache the first time: tests/kernels/oldest_triton.py), because interpreters
differ between versions (Triton 3.6's, on the GPU machines, rejected a loop bound that 3.9's
accepts). Both start with the session, in the background at the lowest priority
(tests/kernels/interpreted_runs.py): the tests here read their results.
"""

import importlib
import os
from pathlib import Path

import pytest
import triton  # the optional extra must be installed for these tests: fail, never skip
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from tests.kernels import interpreted_runs, oldest_triton
from tuneup.plugins.kernels import triton_on_cpu  # noqa: F401  (imports the kernels)

H200 = GPUTarget("cuda", 90, 32)

support = importlib.import_module("tuneup.plugins.kernels.triton_support")
ce_rows = importlib.import_module("tuneup.plugins.kernels.cross_entropy_rows")
lamb_triton = importlib.import_module("tuneup.plugins.kernels.lamb_triton")
lars_module = importlib.import_module("tuneup.plugins.kernels.lars")


@pytest.fixture(scope="module")
def interpreted(request, tmp_path_factory):
    """Both interpreter runs' results: ``interpreted[name]`` is (returncode, output). Those
    the session started in the background (tests/conftest.py), or run here and now (without
    pytest's cache, where the session did not start them)."""
    folder = os.environ.get(interpreted_runs.FOLDER_VARIABLE)
    if folder is not None:
        return interpreted_runs.wait_for(Path(folder))
    cache = getattr(request.config, "cache", None)
    cache_dir = (
        tmp_path_factory.mktemp("cache") if cache is None else oldest_triton.cache_dir(cache)
    )
    here = tmp_path_factory.mktemp("interpreted")
    return interpreted_runs.run_all(here, cache_dir, triton.__version__)


def test_kernels_under_the_triton_interpreter(interpreted):
    returncode, output = interpreted["installed"]
    assert returncode == 0, output[-12000:]
    assert " passed" in output


def test_kernel_bench_smoke_run_under_the_triton_interpreter(interpreted):
    """``python bench/kernels.py --smoke`` ran in the same subprocess (test_interpreted_bench.py)."""
    returncode, output = interpreted["installed"]
    assert returncode == 0, output[-12000:]
    assert "PASSED tests/kernels/test_interpreted_bench.py::test_smoke_run" in output


def test_kernels_under_the_oldest_supported_triton_interpreter(interpreted):
    version = interpreted["oldest_version"]
    if "oldest" not in interpreted:
        message = f"could not pip install triton=={version}: {interpreted['pip_error']}"
        if os.environ.get("CI"):  # CI reaches PyPI: there this is a failure, not a skip
            pytest.fail(message)
        pytest.skip(message)  # e.g. a GPU machine without a package index
    returncode, output = interpreted["oldest"]
    assert returncode == 0, output[-12000:]
    assert " passed" in output


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
        n_rows="i32",
        n_classes="i32",
        ignore_index="i32",
        label_smoothing="fp32",
    )
    lars_hyper = {n: "fp32" for n in ("lr", "momentum", "weight_decay", "trust_coefficient", "eps")}
    return [
        (
            "cross_entropy one pass",
            ce_rows._cross_entropy_rows_kernel,
            ce_args,
            dict(COMPUTE_GRAD=True, ONE_PASS=True, BLOCK=ce_rows.MAX_ONE_PASS, PERSISTENT=False),
            32,
        ),
        (
            "cross_entropy two passes",
            ce_rows._cross_entropy_rows_kernel,
            ce_args,
            dict(COMPUTE_GRAD=True, ONE_PASS=False, BLOCK=ce_rows.MAX_BLOCK, PERSISTENT=False),
            8,
        ),
        (
            "cross_entropy two passes, persistent",
            ce_rows._cross_entropy_rows_kernel,
            ce_args,
            dict(COMPUTE_GRAD=True, ONE_PASS=False, BLOCK=ce_rows.MAX_BLOCK, PERSISTENT=True),
            8,
        ),
        (
            "cross_entropy loss only",
            ce_rows._cross_entropy_rows_kernel,
            ce_args,
            dict(COMPUTE_GRAD=False, ONE_PASS=False, BLOCK=ce_rows.MAX_BLOCK, PERSISTENT=False),
            8,
        ),
        ("lamb moments", lamb_triton._lamb_moments_kernel, {**MULTI_TENSOR, **HYPER}, FLAGS, 4),
        (
            "lamb update",
            lamb_triton._lamb_update_kernel,
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
