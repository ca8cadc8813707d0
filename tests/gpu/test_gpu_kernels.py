"""The Triton kernels compiled for the GPU, at real sizes, against their references.

On CPU the kernels are checked under Triton's interpreter at toy sizes (tests/kernels/); here
they are compiled, at the sizes of bench/kernels.py's smaller cases, in fp32, fp16 and bf16:
loss, gradient, and optimizer steps (with GradScaler's scale and skipped steps), eager and
under torch.compile, and as users switch them on (kernels=[...], optimizer=lamb|lars with
fused and compile). Marked ``gpu``: skipped, saying why, without CUDA.

Tolerances: a kernel and its reference read the same inputs and compute in fp32, so they
differ by the order of fp32 sums (about 1e-5 relative over 128k classes) and by one rounding
of the half-precision result (2^-8 relative for bf16, 2^-11 for fp16).
"""

from __future__ import annotations

import csv
import importlib
import math

import pytest
import torch
import torch.nn.functional as F

from tuneup.plugins.kernels import Lamb, Lars, ran

pytestmark = pytest.mark.gpu

ce = importlib.import_module("tuneup.plugins.kernels.cross_entropy")
lce = importlib.import_module("tuneup.plugins.kernels.linear_cross_entropy")

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
#: Relative error (of a whole tensor, by norm) allowed for a result stored in each dtype.
ROUNDING = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


@pytest.fixture(autouse=True)
def exact_fp32_matmuls(monkeypatch):
    """No TF32 in the references' matmuls, whatever an earlier test left."""
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).norm() / want.float().norm().clamp_min(1e-30))


def rows(n_rows: int, n_classes: int, dtype, seed=0):
    generator = torch.Generator(device="cuda").manual_seed(seed)
    logits = 3 * torch.randn(n_rows, n_classes, device="cuda", generator=generator)
    target = torch.randint(0, n_classes, (n_rows,), device="cuda", generator=generator)
    target[::7] = -100
    return logits.to(dtype), target


def loss_rows_and_grad(implementation, logits, target, label_smoothing):
    n_valid = (target != -100).sum()
    grad = torch.empty_like(logits)
    losses = ce.cross_entropy_rows(
        logits, target, n_valid, label_smoothing, -100, grad, implementation
    )
    return losses, grad


# --- cross-entropy -----------------------------------------------------------------------


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n_classes", [32000, 128256], ids=["one-pass", "two-pass"])
def test_cross_entropy_kernel_matches_its_reference(n_classes, dtype, label_smoothing):
    logits, target = rows(2048, n_classes, dtype)
    losses, grad = loss_rows_and_grad("triton", logits, target, label_smoothing)
    want_losses, want_grad = loss_rows_and_grad("reference", logits, target, label_smoothing)
    assert losses.dtype == torch.float32 and grad.dtype == dtype
    torch.testing.assert_close(losses, want_losses, rtol=1e-5, atol=1e-4)
    assert relative_error(grad, want_grad) < ROUNDING[dtype]


def test_cross_entropy_op_gives_torchs_loss_and_gradient():
    ran.clear()
    logits, target = rows(4096, 50304, torch.float32)
    logits.requires_grad_()
    loss = ce.cross_entropy(logits, target, label_smoothing=0.1)
    (grad,) = torch.autograd.grad(loss, logits)
    want = F.cross_entropy(logits, target, label_smoothing=0.1)
    (want_grad,) = torch.autograd.grad(want, logits)
    torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-5)
    assert relative_error(grad, want_grad) < 1e-5
    assert ran == {"cross_entropy": {"triton"}}


# --- linear + cross-entropy --------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_linear_cross_entropy_kernel_matches_its_reference(dtype):
    generator = torch.Generator(device="cuda").manual_seed(0)
    hidden = torch.randn(4096, 1024, device="cuda", generator=generator).to(dtype)
    weight = (torch.randn(32000, 1024, device="cuda", generator=generator) / 32).to(dtype)
    target = torch.randint(0, 32000, (4096,), device="cuda", generator=generator)
    target[::9] = -100
    args = (hidden, weight, target, None, 1024, 0.1, -100, True)
    got = lce.chunked_loss_and_grads(*args, "triton")
    want = lce.chunked_loss_and_grads(*args, "reference")  # same matmuls, reference rows
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-4)
    for name, g, w in zip(("hidden", "weight"), got[1:3], want[1:3], strict=True):
        assert g.dtype == dtype, name
        assert relative_error(g, w) < ROUNDING[dtype], name


def test_linear_cross_entropy_op_gives_the_unfused_heads_loss_and_gradients():
    ran.clear()
    generator = torch.Generator(device="cuda").manual_seed(1)
    hidden = torch.randn(2048, 768, device="cuda", generator=generator).requires_grad_()
    weight = (torch.randn(50304, 768, device="cuda", generator=generator) / 28).requires_grad_()
    target = torch.randint(0, 50304, (2048,), device="cuda", generator=generator)
    loss = lce.linear_cross_entropy(hidden, weight, target)
    grads = torch.autograd.grad(loss, (hidden, weight))
    want = F.cross_entropy(hidden @ weight.T, target)
    want_grads = torch.autograd.grad(want, (hidden, weight))
    torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-5)
    for got, expected in zip(grads, want_grads, strict=True):  # fp32 sums in other orders
        assert relative_error(got, expected) < 1e-4
    assert ran == {"linear_cross_entropy": {"triton"}}


# --- LAMB and LARS -----------------------------------------------------------------------


def transformer_shapes(width=1024, layers=2):
    """Matrices, biases and norm scales of a GPT-style stack (as bench/kernels.py)."""
    per_layer = [(3 * width, width), (width, width), (4 * width, width), (width, 4 * width)]
    per_layer += [(3 * width,), (4 * width,)] + [(width,)] * 6
    return per_layer * layers


def random_problem(dtype, steps=5, seed=0):
    generator = torch.Generator(device="cuda").manual_seed(seed)
    shapes = transformer_shapes()
    weights = [0.02 * torch.randn(s, device="cuda", generator=generator) for s in shapes]
    grads = [
        [torch.randn(s, device="cuda", generator=generator) / math.sqrt(s[-1]) for s in shapes]
        for _ in range(steps)
    ]
    return [w.to(dtype) for w in weights], [[g.to(dtype) for g in step] for step in grads]


def run_steps(make_optimizer, weights, grads, scale=None):
    """Final parameters after one step per gradient list; `scale`: grads arrive scaled, the
    optimizer gets GradScaler's grad_scale and found_inf (as GradScaler hands them over)."""
    params = [w.clone().requires_grad_() for w in weights]
    optimizer = make_optimizer(params)
    if scale is not None:
        optimizer.grad_scale = torch.tensor(scale, device="cuda")
        optimizer.found_inf = torch.tensor(0.0, device="cuda")
    for step_grads in grads:
        for param, grad in zip(params, step_grads, strict=True):
            param.grad = grad.clone() if scale is None else grad * scale
        optimizer.step()
    return [p.detach() for p in params], optimizer


HYPER = {Lamb: dict(lr=1e-2, weight_decay=0.01), Lars: dict(lr=0.5, trust_coefficient=0.02)}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("optimizer_class", [Lamb, Lars])
def test_fused_step_matches_the_reference_step(optimizer_class, dtype):
    """Same weights, gradients and dtype, 5 steps. In fp32 the updates agree to the order of
    the norms' sums; in half precision both compute in fp32 and round the weights once (LAMB's
    moments are fp32: the fp16 moments' subnormals put the fused step 42x off on an H200,
    2026-11-27): the weights then agree to about one rounding."""
    weights, grads = random_problem(dtype)
    hyper = HYPER[optimizer_class]
    fused, optimizer = run_steps(lambda p: optimizer_class(p, **hyper, fused=True), weights, grads)
    reference, _ = run_steps(lambda p: optimizer_class(p, **hyper), weights, grads)
    assert optimizer.implementation == "triton"
    for got, want, start in zip(fused, reference, weights, strict=True):
        assert got.dtype == dtype
        assert relative_error(want, start) > 1e-2  # the steps moved the weights
        if dtype == torch.float32:  # norms summed in another order, over 5 steps
            assert relative_error(got - start, want - start) < 1e-4
        else:
            assert relative_error(got, want) < ROUNDING[dtype]


@pytest.mark.parametrize("optimizer_class", [Lamb, Lars])
def test_fused_step_unscales_and_skips_as_grad_scaler_asks(optimizer_class):
    weights, grads = random_problem(torch.float32, steps=3)
    hyper = HYPER[optimizer_class]
    make = lambda p: optimizer_class(p, **hyper, fused=True)  # noqa: E731
    plain, _ = run_steps(make, weights, grads)
    scaled, optimizer = run_steps(make, weights, grads, scale=65536.0)
    for got, want in zip(scaled, plain, strict=True):
        assert relative_error(got, want) < 1e-5
    optimizer.found_inf = torch.tensor(1.0, device="cuda")
    before = [p.clone() for p in optimizer.param_groups[0]["params"]]
    optimizer.step()  # an inf step: nothing moves, not even the step count
    for param, was in zip(optimizer.param_groups[0]["params"], before, strict=True):
        assert torch.equal(param, was)


@pytest.mark.parametrize("fused", [False, True], ids=["reference", "fused"])
@pytest.mark.parametrize("optimizer_class", [Lamb, Lars])
def test_compiled_step_matches_the_eager_step(optimizer_class, fused):
    """torch.compile (inductor) of the whole step; the fused kernels themselves run eagerly."""
    torch._dynamo.reset()
    weights, grads = random_problem(torch.float32, steps=3)
    hyper = HYPER[optimizer_class]
    eager, _ = run_steps(lambda p: optimizer_class(p, **hyper, fused=fused), weights, grads)

    def compiled(params):
        optimizer = optimizer_class(params, **hyper, fused=fused)
        optimizer.step = torch.compile(optimizer.step)
        return optimizer

    got, optimizer = run_steps(compiled, weights, grads)
    assert optimizer.implementation == ("triton" if fused else "reference")
    for g, w in zip(got, eager, strict=True):  # inductor may sum in another order
        assert relative_error(g, w) < 1e-4


# --- as users switch them on -------------------------------------------------------------

GPT = [
    "model=gpt",
    "data=synthetic_tokens",
    "model.layers=2",
    "model.width=64",
    "model.heads=2",
    "data.context=32",
    "data.vocab_size=512",
    "data.train_samples=640",
    "data.val_samples=64",
    "data.batch_size=32",
    "trainer.max_steps=20",
    "trainer.max_epochs=-1",
    "trainer.log_every_n_steps=1",
    "trainer.enable_progress_bar=false",
    "trainer.accelerator=gpu",
]


def train_losses(run_dir) -> list[float]:
    rows_ = csv.DictReader((run_dir / "metrics.csv").open())
    return [float(row["train/loss"]) for row in rows_ if row.get("train/loss")]


def test_fused_loss_ops_run_triton_and_train_like_the_unfused_run(train, tmp_path):
    fused, fused_dir = train(
        *GPT,
        "kernels=[cross_entropy,linear_cross_entropy]",
        "kernels.require_triton=true",
        tiny=False,
        run_dir=tmp_path / "fused",
    )
    _, plain_dir = train(*GPT, tiny=False, run_dir=tmp_path / "plain")
    assert fused["kernels"] == {"cross_entropy": ["triton"], "linear_cross_entropy": ["triton"]}
    assert fused["plugins"]["kernels"]["implementation"] == "triton"
    losses, reference = train_losses(fused_dir), train_losses(plain_dir)
    assert len(losses) == len(reference) == 20
    # fp32, TF32 off: the chunked head sums in another order; a wrong kernel is off by far more
    torch.testing.assert_close(losses, reference, atol=1e-3, rtol=0)


@pytest.mark.parametrize("compile_", ["off", "on"])
@pytest.mark.parametrize("fused", [False, True], ids=["reference", "fused"])
@pytest.mark.parametrize(("optimizer", "lr"), [("lamb", 0.02), ("lars", 5.0)])
def test_large_batch_optimizers_train_fused_or_not_compiled_or_not(
    train, optimizer, lr, fused, compile_
):
    summary, run_dir = train(
        f"optimizer={optimizer}",
        f"optimizer.lr={lr}",
        f"optimizer.fused={str(fused).lower()}",
        f"compile={compile_}",
        "data.signal=0.3",
        "trainer.max_epochs=3",
        "trainer.accelerator=gpu",
    )
    implementation = "triton" if fused else "reference"
    assert summary["optimizer"] == {"implementation": implementation, "lr": pytest.approx(lr)}
    losses = train_losses(run_dir)
    assert losses[-1] < losses[0] - 0.2  # it trains


def test_liger_backend_runs_liger_and_trains_like_the_unfused_run(train, tmp_path):
    pytest.importorskip("liger_kernel", reason="kernels.backend=liger needs liger-kernel")
    gpt = [
        "model=gpt",
        "data=synthetic_tokens",
        "model.layers=2",
        "model.width=64",
        "model.heads=2",
        "data.context=64",
        "data.vocab_size=4096",
        "data.train_samples=320",
        "data.val_samples=32",
        "data.batch_size=16",
        "trainer.max_epochs=1",
        "trainer.enable_progress_bar=false",
        "trainer.accelerator=gpu",
    ]
    liger, _ = train(
        *gpt,
        "kernels=[cross_entropy,linear_cross_entropy]",
        "kernels.backend=liger",
        tiny=False,
        run_dir=tmp_path / "liger",
    )
    plain, _ = train(*gpt, tiny=False, run_dir=tmp_path / "plain")
    assert liger["kernels"] == {"cross_entropy": ["liger"], "linear_cross_entropy": ["liger"]}
    assert liger["plugins"]["kernels"]["implementation"].startswith("liger ")
    torch.testing.assert_close(
        liger["loss_curve"]["loss"], plain["loss_curve"]["loss"], rtol=1e-4, atol=1e-4
    )
