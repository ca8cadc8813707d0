"""``torch.compile``, chosen by ``compile=off|on``: the model's forward and backward as fused kernels.

Applied with ``nn.Module.compile`` (in place) last in the ``configure_model``
pipeline (``trylast``), after kernel swaps, activation checkpointing and
memory format, so it compiles the model they produced. In place rather than
``torch.compile(model)``: the latter wraps the model in an ``OptimizedModule``
whose parameter names gain an ``_orig_mod.`` prefix, so checkpoints of a
compiled run would not load into an uncompiled one; ``Module.compile`` keeps
every name.

Compilation is lazy: it happens inside the first training step (forward and,
through AOTAutograd, backward), which the measure plugin leaves out of the
step-time figures as warm-up. ``compile_seconds`` is that first step's wall
time minus the median of the next ones (host clock, no device synchronisation),
i.e. the time the first step spent compiling. Validation compiles its own
(eval-mode) graph on its first batch; that lands in validation time, which is
not in the step figures either.

A user's own LightningModule (``model=lightning``) is compiled the same way: its
``forward``, which its ``training_step`` reaches by calling ``self(x)``; one that defines no
``forward`` is a check error, not a compile that silently does nothing.

On CPU, inductor generates C++ and needs a C++ compiler; on CUDA it generates
Triton kernels and needs ``triton``. ``check`` says so before anything is built.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import statistics
import time

import torch
from omegaconf import OmegaConf
from torch import nn

from tuneup import hookimpl
from tuneup.trainer.validation import BOOL, OneOf, problem, problems

MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")

#: Training micro-batches timed: the first (compiling) and the ones whose median it is compared to.
TIMED_STEPS = 6


def compile_model(
    model: nn.Module, mode="default", fullgraph=False, dynamic=None, backend="inductor"
) -> nn.Module:
    """Compile ``model`` in place (parameter names unchanged); returns it. Lazy: the first
    call compiles."""
    model.compile(mode=mode, fullgraph=fullgraph, dynamic=dynamic, backend=backend)
    return model


def first_step_overhead(step_seconds: list[float]) -> float | None:
    """Seconds the first step took beyond a typical one (the median of the others)."""
    if len(step_seconds) < 2:
        return None
    return max(0.0, step_seconds[0] - statistics.median(step_seconds[1:]))


def toolchain_problem(env, backend: str) -> str | None:
    """What inductor lacks on this machine (a C++ compiler on CPU, triton on CUDA), or None."""
    if backend != "inductor":
        return None
    if env.is_cuda and importlib.util.find_spec("triton") is None:
        return (
            "compile=on needs the 'triton' package on CUDA (inductor generates Triton "
            "kernels): pip install triton, or use compile=off"
        )
    compilers = (os.environ.get("CXX"), "g++", "c++", "clang++")
    if not env.is_cuda and not any(c and shutil.which(c) for c in compilers):
        return (
            "compile=on on CPU needs a C++ compiler (inductor generates C++): install g++ "
            "or clang, set CXX, or use compile=off"
        )
    return None


def defines_forward(module_class) -> bool:
    """Whether a LightningModule class has a forward of its own (Lightning's raises)."""
    import pytorch_lightning as pl

    if not isinstance(module_class, type):
        return True  # a factory: its module is checked when built
    return module_class.forward is not pl.LightningModule.forward


class Plugin:
    def __init__(self, cfg) -> None:
        s = cfg.compile
        self.options = {
            "mode": s.get("mode", "default"),
            "fullgraph": s.get("fullgraph", False),
            "dynamic": s.get("dynamic"),
            "backend": s.get("backend", "inductor"),
        }
        self.step_seconds: list[float] = []
        self.started: float | None = None
        self.per_block = False

    @hookimpl
    def check(self, cfg, env, plan):
        found = problems(
            cfg,
            {
                "compile.mode": OneOf(MODES),
                "compile.fullgraph": BOOL,
                "compile.dynamic": OneOf((True, False, None)),
            },
        )
        backend = self.options["backend"]
        if backend not in torch.compiler.list_backends(exclude_tags=()):
            usual = ", ".join(torch.compiler.list_backends())
            allowed = f"a torch.compile backend: {usual} (debugging: eager, aot_eager)"
            found.append(problem("compile.backend", backend, allowed))
        reason = toolchain_problem(env, backend)
        found += [reason] if reason else []
        if plan is not None and plan.lightning and not defines_forward(plan.model_target):
            found.append(
                f"compile=on compiles the LightningModule's forward, but {plan.model_name} "
                "defines none (its training_step calls its layers directly); define forward, "
                "call self(x) in training_step, or use compile=off"
            )
        return found

    @hookimpl(trylast=True)  # after kernel swaps, checkpointing, memory format: compile the result
    def configure_model(self, cfg, model):
        if OmegaConf.select(cfg, "strategy.name") == "fsdp":
            self.per_block = True  # the strategy compiles each block, before sharding them
            return model
        return compile_model(model, **self.options)

    @hookimpl
    def on_train_batch_start(self):
        if len(self.step_seconds) < TIMED_STEPS:
            self.started = time.perf_counter()

    @hookimpl
    def on_train_batch_end(self):
        if self.started is not None:
            self.step_seconds.append(time.perf_counter() - self.started)
            self.started = None

    @hookimpl
    def report(self, summary):
        summary["compile_seconds"] = first_step_overhead(self.step_seconds)

    def describe(self):
        return {"name": "on", **self.options, "per_block": self.per_block}
