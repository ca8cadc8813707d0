"""Oracles shared by the reference-path tests and the Triton-interpreter tests.

test_interpreted_kernels.py and test_interpreted_bench.py need TRITON_INTERPRET=1 set before
plugins.kernels is imported, so they are collected only in the subprocess test_triton_kernels.py
starts with that variable set.
"""

from __future__ import annotations

import os
import types

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

INTERPRETED_TESTS = ("test_interpreted_kernels.py", "test_interpreted_bench.py")


def pytest_ignore_collect(collection_path, config):
    if collection_path.name in INTERPRETED_TESTS and os.environ.get("TRITON_INTERPRET") != "1":
        return True
    return None


def paper_lamb(weights, grads_per_step, *, lr, betas, eps, weight_decay, excluded, trust_clip):
    """You et al. 2019, Algorithm 2, tensor by tensor in float64; excluded: plain Adam."""
    beta1, beta2 = betas
    results = []
    for weight, grads, is_excluded in zip(weights, grads_per_step, excluded, strict=True):
        w = weight.double().clone()
        m, v = torch.zeros_like(w), torch.zeros_like(w)
        for t, g in enumerate(grads, start=1):
            g = g.double()
            m = beta1 * m + (1 - beta1) * g
            v = beta2 * v + (1 - beta2) * g * g
            r = (m / (1 - beta1**t)) / ((v / (1 - beta2**t)).sqrt() + eps)
            if is_excluded:
                w = w - lr * r
                continue
            u = r + weight_decay * w
            w_norm, u_norm = w.norm().item(), u.norm().item()
            ratio = w_norm / u_norm if w_norm > 0 and u_norm > 0 else 1.0
            if trust_clip is not None:
                ratio = min(ratio, trust_clip)
            w = w - lr * ratio * u
        results.append(w)
    return results


def paper_lars(weights, grads_per_step, *, lr, momentum, weight_decay, eta, eps, excluded):
    """You et al. 2017, Algorithm 1, tensor by tensor in float64; excluded: momentum SGD."""
    results = []
    for weight, grads, is_excluded in zip(weights, grads_per_step, excluded, strict=True):
        w = weight.double().clone()
        velocity = torch.zeros_like(w)
        for g in grads:
            g = g.double()
            local_lr, decay = 1.0, 0.0
            if not is_excluded:
                decay = weight_decay
                w_norm, g_norm = w.norm().item(), g.norm().item()
                if w_norm > 0 and g_norm > 0:
                    local_lr = eta * w_norm / (g_norm + weight_decay * w_norm + eps)
            velocity = momentum * velocity + lr * local_lr * (g + decay * w)
            w = w - velocity
        results.append(w)
    return results


#: Parameter shapes for optimizer tests: odd sizes, a bias-like 1-D tensor (excluded) and a
#: tensor spanning several chunks when tests shrink CHUNK_NUMEL.
SHAPES = [(13, 7), (5,), (130,), (3, 4, 5), (1, 1)]


def random_problem(seed=0, steps=7, dtype=torch.float32):
    """Initial weights (magnitude ~1) and one random gradient per step for each of SHAPES."""
    generator = torch.Generator().manual_seed(seed)
    weights = [0.5 * torch.randn(s, generator=generator, dtype=dtype) for s in SHAPES]
    grads = [
        [torch.randn(s, generator=generator, dtype=dtype) for _ in range(steps)] for s in SHAPES
    ]
    return weights, grads


def run_optimizer(make_optimizer, weights, grads_per_step):
    """Final weights after feeding the given gradients, one step each."""
    params = [w.clone().requires_grad_() for w in weights]
    optimizer = make_optimizer(params)
    for step in range(len(grads_per_step[0])):
        for param, grads in zip(params, grads_per_step, strict=True):
            param.grad = grads[step].clone()
        optimizer.step()
    return [p.detach() for p in params], optimizer


class TinyLanguageModel(torch.nn.Module):
    """Embedding, one hidden layer with a norm, and an LM head (weight [V, D] and bias)."""

    def __init__(self, vocab=37, width=16):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.hidden = torch.nn.Linear(width, width)
        self.norm = torch.nn.LayerNorm(width)
        self.head = torch.nn.Linear(width, vocab)

    def features(self, tokens):
        return self.norm(torch.tanh(self.hidden(self.embed(tokens))))


def training_losses(loss_name, make_optimizer, steps=20, fused_ops=True):
    """Losses of `steps` steps of next-token training on a fixed random batch stream.

    fused_ops: the head loss through plugins.kernels; otherwise plain F.cross_entropy.
    """
    from tuneup.plugins.kernels import cross_entropy, linear_cross_entropy

    torch.manual_seed(0)
    model = TinyLanguageModel()
    optimizer = make_optimizer(model.parameters())
    generator = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        tokens = torch.randint(0, 37, (2, 9), generator=generator)
        hidden, target = model.features(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten()
        target[::7] = -100
        weight, bias = model.head.weight, model.head.bias
        if not fused_ops:
            loss = F.cross_entropy(hidden @ weight.T + bias, target, label_smoothing=0.1)
        elif loss_name == "linear_cross_entropy":
            loss = linear_cross_entropy(
                hidden, weight, target, bias, chunk_size=10, label_smoothing=0.1
            )
        else:
            loss = cross_entropy(hidden @ weight.T + bias, target, label_smoothing=0.1)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return torch.tensor(losses, dtype=torch.float64)


@pytest.fixture
def oracles():
    """The test helpers above, as one namespace (conftest modules are not imported by tests)."""
    return types.SimpleNamespace(
        paper_lamb=paper_lamb,
        paper_lars=paper_lars,
        random_problem=random_problem,
        run_optimizer=run_optimizer,
        training_losses=training_losses,
    )


class OpNames(TorchDispatchMode):
    """The aten ops run while it is active."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.name())
        return func(*args, **(kwargs or {}))
