"""Framework overhead: the same model, data and steps run three ways in one process.

1. a hand-written PyTorch loop,
2. bare Lightning (a minimal LightningModule, no logger, checkpointing or progress bar),
3. tuneup with its default plugins (measurement, csv logger, the bridge callback, precision,
   grad_accum, strategy), checkpointing off like the other two (a save costs what it costs in
   any loop: see the checkpoint plugin).

Each way trains the same number of steps from the same seed; the time of the steps after
a warm-up is taken from the same timing callback (the hand loop times itself the same way),
the ways run interleaved ``--repeats`` times after an untimed round, and the median is
reported, with the median of the ratios within each repeat ("paired": this machine's drift
between repeats cancels in it).

    python bench/overhead.py                     # default small_resnet, and the tiny mlp
    python bench/overhead.py --models mlp --steps 400
    python bench/overhead.py --models mlp --per-plugin   # tuneup with each default plugin off
    python bench/overhead.py --models mlp --calls        # Python calls and torch ops a step

``--per-plugin`` times tuneup again with each plugin of the default run left out in turn
(unregistered after loading, as ``plugins.disable=[name]`` would, but also where the config
names the plugin, which that setting refuses, and for the required ``measure``): a
regression in the step time points to its plugin.

``--calls`` counts Python function calls a step (cProfile, over the same measured steps) in
bare Lightning and in tuneup, and lists the functions tuneup calls more often; then the torch
ops a step (aten operators, forward and backward, through a ``TorchDispatchMode``) and
the ops tuneup dispatches more often. Unlike the
times, the counts do not depend on the machine's load: a regression shows on a busy machine.
Measure a multiple of ``trainer.log_every_n_steps`` (20 by default) so that the logging steps
count in their true proportion.
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import pstats
import statistics
import tempfile
import time
from pathlib import Path

import pytorch_lightning as pl
import torch

import tuneup
from tuneup.trainer.build import build
from tuneup.trainer.components import Plan
from tuneup.trainer.environment import Environment
from tuneup.trainer.plugin_manager import PluginManager
from tuneup.trainer.task import classification_loss as cross_entropy


def config(model: str, steps: int, batch_size: int, more: tuple[str, ...] = ()):
    overrides = [
        f"model={model}",
        f"trainer.max_steps={steps}",
        "trainer.max_epochs=-1",
        f"data.batch_size={batch_size}",
        "trainer.enable_progress_bar=false",
        "+trainer.limit_val_batches=0",
        "checkpoint=off",
        "scheduler=constant",
        *more,
    ]
    return tuneup.compose(overrides)


class StepClock(pl.Callback):
    """Seconds from the start of micro-batch ``warmup`` to the end of the last one; with a
    ``profile``, cProfile runs over the same steps."""

    def __init__(self, warmup: int, profile: cProfile.Profile | OpCounter | None = None) -> None:
        self.warmup, self.start, self.end = warmup, None, None
        self.profile = profile

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        if trainer.global_step == self.warmup and self.start is None:
            self.start = time.perf_counter()
            if self.profile is not None:
                self.profile.enable()

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.end = time.perf_counter()
        if self.profile is not None and trainer.global_step == trainer.max_steps:
            self.profile.disable()

    @property
    def seconds(self) -> float:
        return self.end - self.start


def constant_schedule(optimizer):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)


def sgd(cfg, params):
    o = cfg.optimizer
    return torch.optim.SGD(
        params, lr=o.lr, momentum=o.momentum, nesterov=o.nesterov, weight_decay=o.weight_decay
    )


def hand_loop(cfg, warmup: int) -> float:
    pl.seed_everything(cfg.seed, verbose=False)
    plan = Plan(cfg)
    data = plan.data
    data.setup("fit")
    model = plan.build_model()
    optimizer = sgd(cfg, model.parameters())
    scheduler = constant_schedule(optimizer)
    model.train()
    step, start, cpu = 0, None, torch.device("cpu")
    while step < cfg.trainer.max_steps:
        for batch in data.train_dataloader():
            x, y = data.device_batch(batch, cpu)  # the same work: uint8 to normalised float
            if step == warmup:
                start = time.perf_counter()
            loss = cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
            step += 1
            if step == cfg.trainer.max_steps:
                break
    return time.perf_counter() - start


class BareModule(pl.LightningModule):
    def __init__(self, cfg, model) -> None:
        super().__init__()
        self.cfg, self.model = cfg, model

    def training_step(self, batch, batch_idx):
        x, y = batch
        return cross_entropy(self.model(x), y)

    def configure_optimizers(self):
        optimizer = sgd(self.cfg, self.model.parameters())
        # stepped every step, as in the hand loop and in tuneup
        schedule = {"scheduler": constant_schedule(optimizer), "interval": "step"}
        return {"optimizer": optimizer, "lr_scheduler": schedule}


def bare_lightning(cfg, warmup: int, profile: cProfile.Profile | OpCounter | None = None) -> float:
    pl.seed_everything(cfg.seed, verbose=False)
    plan = Plan(cfg)
    data, model = plan.data, plan.build_model()
    clock = StepClock(warmup, profile)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=cfg.trainer.max_steps,
        max_epochs=-1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        callbacks=[clock],
    )
    trainer.fit(BareModule(cfg, model), datamodule=data)
    return clock.seconds


def with_tuneup(
    cfg,
    warmup: int,
    without: str | None = None,
    profile: cProfile.Profile | OpCounter | None = None,
) -> float:
    with tempfile.TemporaryDirectory() as run_dir:
        plugins = PluginManager.from_config(cfg)
        plan = Plan(cfg, plugins)
        assert not plugins.check(cfg, Environment.from_config(cfg), plan) + plan.problems
        if without is not None:
            plugins.unregister(name=without)
        trainer, module, data, _ = build(cfg, plugins, plan, Path(run_dir))
        clock = StepClock(warmup, profile)
        trainer.callbacks.append(clock)
        trainer.fit(module, datamodule=data)
    return clock.seconds


WAYS = {"hand loop": hand_loop, "bare Lightning": bare_lightning, "tuneup": with_tuneup}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["small_resnet", "mlp"])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--per-plugin", action="store_true", help="tuneup with each default plugin left out in turn"
    )
    parser.add_argument(
        "--calls", action="store_true", help="Python calls a step vs bare Lightning (no timing)"
    )
    parser.add_argument("--top", type=int, default=25, help="--calls: functions listed")
    args = parser.parse_args()
    if args.calls:
        for model in args.models:
            print_calls(model, config(model, args.steps, args.batch_size), args)
        return
    import logging

    logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{args.steps} steps ({args.warmup} warm-up), batch {args.batch_size}"
    )
    print(
        "| model | way | ms/step (median) | vs bare Lightning | paired vs bare Lightning "
        "| vs hand loop |"
    )
    print("|---|---|---|---|---|---|")
    for model in args.models:
        cfg = config(model, args.steps, args.batch_size)
        for fn in WAYS.values():  # a round untimed: the first run of each way paid for warm-up
            fn(cfg, args.warmup)
        times = {way: [] for way in WAYS}
        for _ in range(args.repeats):
            for way, fn in WAYS.items():
                times[way].append(fn(cfg, args.warmup) * 1e3 / (args.steps - args.warmup))
        med = {way: statistics.median(t) for way, t in times.items()}
        for way in WAYS:
            print(
                f"| {model} | {way} | {med[way]:.2f} | {med[way] / med['bare Lightning']:.3f}x "
                f"| {paired(times[way], times['bare Lightning']):.3f}x "
                f"| {med[way] / med['hand loop']:.3f}x |"
            )
        if args.per_plugin:
            per_plugin(model, cfg, args)


def paired(times: list[float], against: list[float]) -> float:
    """The median of the ratios within each repeat: the ways of a repeat run one after the
    other, so this machine's drift between repeats (10-20 % on a shared two-core VM) cancels,
    where the ratio of the medians keeps it."""
    return statistics.median(t / a for t, a in zip(times, against, strict=True))


def per_plugin(model: str, cfg, args) -> None:
    """tuneup's step time with each of its default plugins left out, interleaved repeats."""
    names = [name for name, _ in PluginManager.from_config(cfg).named_plugins()]
    runs = {None: [], **{name: [] for name in names}}
    for _ in range(args.repeats):
        for name in runs:
            seconds = with_tuneup(cfg, args.warmup, without=name)
            runs[name].append(seconds * 1e3 / (args.steps - args.warmup))
    med = {name: statistics.median(t) for name, t in runs.items()}
    print(f"\n| {model}: plugin left out | ms/step (median) | its cost (all on - without it) |")
    print("|---|---|---|")
    print(f"| none (all on) | {med[None]:.2f} | |")
    for name in names:
        print(f"| {name} | {med[name]:.2f} | {med[None] - med[name]:+.3f} ms |")


def call_counts(way, cfg, warmup: int) -> tuple[float, dict]:
    """(Python calls a step, {function: calls a step}) over the steps after ``warmup``."""
    profile = cProfile.Profile()
    way(cfg, warmup, profile=profile)
    stats = pstats.Stats(profile).stats  # (file, line, name) -> (prim calls, calls, ...)
    steps = cfg.trainer.max_steps - warmup
    per_function = {where: calls / steps for where, (_, calls, *_) in stats.items()}
    return sum(per_function.values()), per_function


class OpCounter:
    """Counts the torch operators dispatched (aten ops, forward and backward) between
    ``enable`` and ``disable``: StepClock starts and stops it as it does cProfile. Like the call
    counts, the counts do not depend on the machine's load; each op costs ~3-10 us on CPU, and
    on CUDA it is a kernel launch."""

    def __init__(self) -> None:
        from torch.utils._python_dispatch import TorchDispatchMode

        counts = self.counts = collections.Counter()

        class Count(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                counts[str(func)] += 1
                return func(*args, **(kwargs or {}))

        self.mode = Count()

    def enable(self) -> None:
        self.mode.__enter__()

    def disable(self) -> None:
        self.mode.__exit__(None, None, None)


def tuneup_extra_ops(cfg, warmup: int) -> tuple[float, float, dict]:
    """(bare Lightning's torch ops a step, tuneup's, {op: tuneup's extra ops a step})."""
    steps, found = cfg.trainer.max_steps - warmup, []
    for way in (bare_lightning, with_tuneup):
        counter = OpCounter()
        way(cfg, warmup, profile=counter)
        found.append({op: n / steps for op, n in counter.counts.items()})
    bare, ours = found
    extra = {op: n - bare.get(op, 0.0) for op, n in ours.items() if n - bare.get(op, 0.0) > 0}
    return sum(bare.values()), sum(ours.values()), extra


def tuneup_extra_calls(cfg, warmup: int) -> tuple[float, float, dict]:
    """(bare Lightning's calls a step, tuneup's, {function: tuneup's extra calls a step})."""
    bare, bare_functions = call_counts(bare_lightning, cfg, warmup)
    ours, our_functions = call_counts(with_tuneup, cfg, warmup)
    extra = {
        where: calls - bare_functions.get(where, 0.0)
        for where, calls in our_functions.items()
        if calls - bare_functions.get(where, 0.0) > 0
    }
    return bare, ours, extra


def print_calls(model: str, cfg, args) -> None:
    bare, ours, extra = tuneup_extra_calls(cfg, args.warmup)
    steps = args.steps - args.warmup
    print(
        f"\n{model}: Python calls a step over {steps} steps (cProfile): bare Lightning "
        f"{bare:.0f}, tuneup {ours:.0f} ({ours - bare:+.0f}, {ours / bare:.3f}x)"
    )
    print("\n| extra calls a step | function |\n|---|---|")
    for (file, line, name), calls in sorted(extra.items(), key=lambda kv: -kv[1])[: args.top]:
        where = f"{Path(file).parent.name}/{Path(file).name}:{line}" if line else file
        print(f"| {calls:.1f} | {name} ({where}) |")
    bare, ours, extra = tuneup_extra_ops(cfg, args.warmup)
    print(
        f"\n{model}: torch ops a step (aten, forward and backward): bare Lightning "
        f"{bare:.1f}, tuneup {ours:.1f} ({ours - bare:+.1f})"
    )
    print("\n| extra ops a step | op |\n|---|---|")
    for op, count in sorted(extra.items(), key=lambda kv: -kv[1])[: args.top]:
        print(f"| {count:.2f} | {op} |")


if __name__ == "__main__":
    main()
