"""The Triton kernels, run by Triton's interpreter on CPU tensors, against the references.

Collected only where TRITON_INTERPRET=1 was set before anything imported plugins.kernels (see
conftest.py); test_triton_kernels.py runs this file in such a subprocess. Block and chunk sizes
are shrunk so that odd sizes span several blocks and chunks, with a ragged last one.
"""

import importlib
import os

import pytest
import torch
import torch.nn.functional as F
import triton  # the optional extra must be installed here: fail, never skip
from packaging.version import Version

from tuneup.plugins.kernels import (
    Lamb,
    Lars,
    cross_entropy,
    linear_cross_entropy,
    ran,
    triton_on_cpu,
)

ce_module = importlib.import_module("tuneup.plugins.kernels.cross_entropy")
ce_rows = importlib.import_module("tuneup.plugins.kernels.cross_entropy_rows")
lce_module = importlib.import_module("tuneup.plugins.kernels.linear_cross_entropy")
lamb_triton = importlib.import_module("tuneup.plugins.kernels.lamb_triton")
lars_module = importlib.import_module("tuneup.plugins.kernels.lars")


def test_the_triton_the_outer_test_chose_runs_here():
    """test_triton_kernels.py runs this file under the installed and the oldest supported Triton."""
    assert Version(triton.__version__) == Version(os.environ["TUNEUP_EXPECT_TRITON"])


@pytest.fixture(autouse=True)
def kernels_on_cpu(monkeypatch):
    monkeypatch.setattr(ce_rows, "MAX_ONE_PASS", 32)
    monkeypatch.setattr(ce_rows, "MAX_BLOCK", 16)
    for module in (lamb_triton, lars_module):
        monkeypatch.setattr(module, "CHUNK_NUMEL", 64)
        monkeypatch.setattr(module, "BLOCK", 16)
    with triton_on_cpu():
        yield


def random_rows(rows, classes, dtype, seed=0):
    generator = torch.Generator().manual_seed(seed)
    logits = (3 * torch.randn(rows, classes, generator=generator)).to(dtype)
    target = torch.randint(0, classes, (rows,), generator=generator)
    target[1::4] = -100
    return logits, target


def rows_and_grad(implementation, logits, target, label_smoothing, in_place=False):
    n_valid = (target != -100).sum()
    grad = logits.clone() if in_place else torch.empty_like(logits)
    source = grad if in_place else logits
    losses = ce_module.cross_entropy_rows(
        source, target, n_valid, label_smoothing, -100, grad, implementation
    )
    return losses, grad


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 1), (5, 29), (6, 33), (13, 103)], ids=str)
def test_cross_entropy_kernel_matches_reference(shape, dtype, label_smoothing):
    logits, target = random_rows(*shape, dtype)
    losses, grad = rows_and_grad("triton", logits, target, label_smoothing)
    want_losses, want_grad = rows_and_grad("reference", logits, target, label_smoothing)
    assert losses.dtype == torch.float32 and grad.dtype == dtype
    torch.testing.assert_close(losses, want_losses, atol=2e-6, rtol=2e-6)
    atol = {torch.float32: 1e-7, torch.float16: 1e-5, torch.bfloat16: 1e-4}[dtype]
    torch.testing.assert_close(grad, want_grad, atol=atol, rtol=1e-2)


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
@pytest.mark.parametrize("classes", [29, 103])
def test_cross_entropy_kernel_handles_blocks_of_minus_infinity(classes, label_smoothing):
    """Masked vocabulary: a whole first block of -inf must not poison the online softmax."""
    logits, target = random_rows(6, classes, torch.float32)
    logits[:, :20] = float("-inf")
    target[target < 20] = 25
    losses, grad = rows_and_grad("triton", logits, target, label_smoothing)
    want_losses, want_grad = rows_and_grad("reference", logits, target, label_smoothing)
    torch.testing.assert_close(losses, want_losses)
    torch.testing.assert_close(grad, want_grad)
    want = F.cross_entropy(logits, target, label_smoothing=label_smoothing)
    torch.testing.assert_close(losses.sum() / (target != -100).sum(), want)


@pytest.mark.parametrize("how", [(False, 16, 4, 3), (True, 32, 4, 2)], ids=["two", "one"])
def test_cross_entropy_kernel_with_programs_looping_over_rows(monkeypatch, how):
    """Fewer programs than rows (bench/kernels.py times such launches): every row is done."""
    monkeypatch.setattr(ce_rows, "LAUNCH", ce_rows.Launch(*how))
    logits, target = random_rows(13, 29, torch.bfloat16)
    losses, grad = rows_and_grad("triton", logits, target, 0.1)
    want_losses, want_grad = rows_and_grad("reference", logits, target, 0.1)
    torch.testing.assert_close(losses, want_losses, atol=2e-6, rtol=2e-6)
    torch.testing.assert_close(grad, want_grad, atol=1e-4, rtol=1e-2)


def test_cross_entropy_kernel_writes_gradient_over_its_input():
    logits, target = random_rows(13, 103, torch.float16)
    losses, grad = rows_and_grad("triton", logits, target, 0.1, in_place=True)
    want_losses, want_grad = rows_and_grad("reference", logits, target, 0.1)
    torch.testing.assert_close(losses, want_losses)
    torch.testing.assert_close(grad, want_grad)


def test_cross_entropy_op_runs_the_kernel_and_matches_torch():
    """Through autograd, with column-major logits (the kernel reads rows contiguously)."""
    ran.clear()
    logits, target = random_rows(13, 103, torch.float32)
    logits = logits.T.contiguous().T.requires_grad_()
    loss = cross_entropy(logits, target, label_smoothing=0.1)
    (grad,) = torch.autograd.grad(loss, logits)
    want = F.cross_entropy(logits, target, label_smoothing=0.1)
    torch.testing.assert_close(loss, want)
    torch.testing.assert_close(grad, torch.autograd.grad(want, logits)[0])
    assert ran == {"cross_entropy": {"triton"}}
    with torch.no_grad():
        torch.testing.assert_close(cross_entropy(logits, target, label_smoothing=0.1), want)


def test_opcheck_on_the_kernel_path():
    logits, target = random_rows(5, 19, torch.float32)
    torch.library.opcheck(
        ce_module.cross_entropy_op, (logits.requires_grad_(), target, 0.1, -100, True)
    )
    generator = torch.Generator().manual_seed(0)
    hidden, weight = (
        torch.randn(s, generator=generator).requires_grad_() for s in [(5, 3), (19, 3)]
    )
    args = (hidden, weight, target, None, 2, 0.0, -100, True)
    torch.library.opcheck(lce_module.linear_cross_entropy_op, args)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_linear_cross_entropy_kernel_matches_unfused_head(dtype):
    ran.clear()
    generator = torch.Generator().manual_seed(0)
    hidden, weight, bias = (
        torch.randn(s, generator=generator).to(dtype).requires_grad_()
        for s in [(29, 8), (45, 8), (45,)]
    )
    target = torch.randint(0, 45, (29,), generator=generator)
    target[::6] = -100
    loss = linear_cross_entropy(hidden, weight, target, bias, chunk_size=7, label_smoothing=0.1)
    grads = torch.autograd.grad(loss, (hidden, weight, bias))
    as_fp32 = [t.detach().float().requires_grad_() for t in (hidden, weight, bias)]
    want = F.cross_entropy(as_fp32[0] @ as_fp32[1].T + as_fp32[2], target, label_smoothing=0.1)
    want_grads = torch.autograd.grad(want, as_fp32)
    tolerance = dict(atol=1e-6, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-3, rtol=0)
    torch.testing.assert_close(loss, want, **tolerance)
    for got, expected in zip(grads, want_grads, strict=True):
        assert got.dtype == dtype
        torch.testing.assert_close(got.float(), expected, **tolerance)
    assert ran == {"linear_cross_entropy": {"triton"}}


def test_liger_backend_gives_torchs_loss_and_gradients():
    """kernels.backend=liger's loss functions (Liger-Kernel's Triton kernels, interpreted)."""
    liger = importlib.import_module("tuneup.plugins.kernels.liger")
    pytest.importorskip("liger_kernel", reason="liger-kernel is in the test extra")
    ran.clear()
    generator = torch.Generator().manual_seed(0)
    hidden, weight, bias = (
        torch.randn(s, generator=generator).requires_grad_() for s in [(2, 9, 8), (45, 8), (45,)]
    )
    target = torch.randint(0, 45, (2, 9), generator=generator)
    target[:, ::4] = -100
    head = torch.nn.Linear(8, 45)
    head.weight, head.bias = torch.nn.Parameter(weight), torch.nn.Parameter(bias)
    settings = {"label_smoothing": 0.1, "ignore_index": -100}
    logits = hidden @ weight.T + bias
    want = F.cross_entropy(logits.flatten(0, 1), target.flatten(), label_smoothing=0.1)
    want_grads = torch.autograd.grad(want, (hidden, weight, bias))
    fused = liger.linear_cross_entropy(head, settings)(hidden, target)
    grads = torch.autograd.grad(fused, (hidden, head.weight, head.bias))
    torch.testing.assert_close(fused, want)
    for got, expected in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(got, expected)
    logits = logits.detach().requires_grad_()
    want = F.cross_entropy(logits.flatten(0, 1), target.flatten(), label_smoothing=0.1)
    (want_grad,) = torch.autograd.grad(want, logits)
    ours = logits.detach().clone().requires_grad_()
    loss = liger.cross_entropy(settings)(ours, target)
    torch.testing.assert_close(loss, want)
    (grad,) = torch.autograd.grad(loss, ours)
    torch.testing.assert_close(grad, want_grad)
    assert ran == {"linear_cross_entropy": {"liger"}, "cross_entropy": {"liger"}}


@pytest.mark.parametrize("trust_clip", [None, 0.5])
def test_fused_lamb_matches_the_paper(oracles, trust_clip):
    hyper = dict(lr=0.02, betas=(0.9, 0.99), eps=1e-6, weight_decay=0.1)
    weights, grads = oracles.random_problem()
    make = lambda p: Lamb(p, **hyper, trust_clip=trust_clip, fused=True)  # noqa: E731
    got, optimizer = oracles.run_optimizer(make, weights, grads)
    excluded = [w.ndim <= 1 for w in weights]
    want = oracles.paper_lamb(weights, grads, **hyper, excluded=excluded, trust_clip=trust_clip)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g.double(), w, atol=1e-6, rtol=0)
    assert optimizer.implementation == "triton"


def test_fused_lars_matches_the_paper(oracles):
    hyper = dict(lr=0.1, momentum=0.9, weight_decay=0.01, eps=1e-8)
    weights, grads = oracles.random_problem()
    make = lambda p: Lars(p, **hyper, trust_coefficient=0.05, fused=True)  # noqa: E731
    got, optimizer = oracles.run_optimizer(make, weights, grads)
    excluded = [w.ndim <= 1 for w in weights]
    want = oracles.paper_lars(weights, grads, **hyper, eta=0.05, excluded=excluded)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g.double(), w, atol=1e-6, rtol=0)
    assert optimizer.implementation == "triton"


@pytest.mark.parametrize("optimizer_class", [Lamb, Lars])
def test_fused_step_handles_mixed_dtypes_amp_scale_and_skips(oracles, optimizer_class):
    """One group of fp32 and fp16 parameters; gradients scaled by 256, then an inf step."""
    hyper = dict(lr=0.05, eps=0.1) if optimizer_class is Lamb else dict(lr=0.05)  # scale-sensitive
    weights, grads = oracles.random_problem(steps=3)
    weights[1], grads[1] = weights[1].half(), [g.half() for g in grads[1]]
    scaled_grads = [[256 * g for g in per_param] for per_param in grads]

    def fused(params):
        optimizer = optimizer_class(params, **hyper, fused=True)
        optimizer.grad_scale, optimizer.found_inf = torch.tensor(256.0), torch.tensor(0.0)
        return optimizer

    got, optimizer = oracles.run_optimizer(fused, weights, scaled_grads)
    want, _ = oracles.run_optimizer(lambda p: optimizer_class(p, **hyper), weights, grads)
    for g, w in zip(got, want, strict=True):
        tolerance = dict(atol=1e-6, rtol=0) if g.dtype == torch.float32 else dict(atol=2e-3, rtol=0)
        torch.testing.assert_close(g, w, **tolerance)
    if optimizer_class is Lamb:  # the kernels' fp32 moments, fp16 parameters too
        moments = [s[k] for s in optimizer.state.values() for k in ("exp_avg", "exp_avg_sq")]
        assert {m.dtype for m in moments} == {torch.float32}

    optimizer.found_inf = torch.tensor(1.0)
    state_before = [{k: v.clone() for k, v in s.items()} for s in optimizer.state.values()]
    params_before = [p.clone() for p in optimizer.param_groups[0]["params"]]
    optimizer.step()
    for p, before in zip(optimizer.param_groups[0]["params"], params_before, strict=True):
        assert torch.equal(p, before)
    for state, before in zip(optimizer.state.values(), state_before, strict=True):
        assert all(torch.equal(state[k], v) for k, v in before.items())


@pytest.mark.parametrize(
    ("loss_name", "optimizer_class", "hyper"),
    [
        ("linear_cross_entropy", Lamb, dict(lr=0.01)),
        ("cross_entropy", Lars, dict(lr=0.5, trust_coefficient=0.02)),
    ],
)
def test_training_losses_match_the_unfused_run(
    oracles, monkeypatch, loss_name, optimizer_class, hyper
):
    # The interpreter pays per program: bigger blocks keep 12 steps quick (still ragged).
    monkeypatch.setattr(ce_rows, "MAX_ONE_PASS", 64)
    for module in (lamb_triton, lars_module):
        monkeypatch.setattr(module, "CHUNK_NUMEL", 1024)
        monkeypatch.setattr(module, "BLOCK", 512)
    ran.clear()
    make_fused = lambda p: optimizer_class(p, **hyper, fused=True)  # noqa: E731
    fused = oracles.training_losses(loss_name, make_fused, steps=12)
    unfused = oracles.training_losses(
        loss_name, lambda p: optimizer_class(p, **hyper), steps=12, fused_ops=False
    )
    torch.testing.assert_close(fused, unfused, atol=1e-5, rtol=0)
    assert fused[-1] < fused[0] - 0.1
    assert ran[loss_name] == {"triton"} and ran[optimizer_class.__name__.lower()] == {
        "triton",
        "reference",
    }


@pytest.mark.parametrize("optimizer_class", [Lamb, Lars])
def test_compiled_fused_step_runs_the_kernels_as_eager_does(oracles, optimizer_class):
    """torch.compile leaves the fused step to run eagerly (its kernels read raw addresses)."""
    torch._dynamo.reset()
    weights, grads = oracles.random_problem(steps=2)
    eager, _ = oracles.run_optimizer(lambda p: optimizer_class(p, fused=True), weights, grads)

    def compiled(params):
        optimizer = optimizer_class(params, fused=True)
        optimizer.step = torch.compile(optimizer.step, backend="aot_eager")
        return optimizer

    got, optimizer = oracles.run_optimizer(compiled, weights, grads)
    for g, w in zip(got, eager, strict=True):
        assert torch.equal(g, w)
    assert optimizer.implementation == "triton"
