"""Gradient accumulation: k micro-batches make one optimizer step with the large batch's gradients."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import torch

from tuneup import TuneupError, hookimpl
from tuneup.plugins.grad_accum import accumulation_steps

#: model=mlp has no model.width, so these replace conftest's TINY for mlp runs.
MLP = [
    "model=mlp",
    "data.train_samples=256",
    "data.val_samples=64",
    "trainer.max_epochs=1",
    "trainer.enable_progress_bar=false",
    "trainer.log_every_n_steps=1",
]


def final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    """The weights of the run's last checkpoint (the one with the most optimizer steps)."""
    loaded = [
        torch.load(p, map_location="cpu", weights_only=False)
        for p in (run_dir / "checkpoints").glob("*.ckpt")
    ]
    return max(loaded, key=lambda checkpoint: checkpoint["global_step"])["state_dict"]


def test_k_micro_batches_give_the_large_batch_weights(cli, tmp_path):
    """The issue's proof, through the command line: 1 x 32 and 4 x 8 reach the same weights.

    Same seed, so the same initial weights and the same shuffled order: the
    four micro-batches of 8 are the batch of 32, split. 1e-6 is relative to
    each tensor's norm (elementwise, a weight near zero has no useful relative error).
    """
    runs = {}
    for batch, k in ((32, 1), (8, 4)):
        run_dir = tmp_path / f"b{batch}"
        result = cli(
            *MLP,
            f"data.batch_size={batch}",
            f"grad_accum.steps={k}",
            "trainer.max_steps=6",
            run_dir=run_dir,
            tiny=False,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        summary = json.loads((run_dir / "summary.json").read_text())
        assert (summary["steps"], summary["micro_batches"]) == (6, 6 * k)
        runs[k] = final_weights(run_dir)
    assert runs[1].keys() == runs[4].keys()
    for name, large in runs[1].items():
        error = (runs[4][name] - large).norm() / large.norm()
        assert error <= 1e-6, f"{name}: relative difference {error:.2e}"


def test_global_batch_size_derives_k_and_summary_counts_samples(train):
    summary, _ = train(*MLP, "data.batch_size=16", "grad_accum.global_batch_size=64", tiny=False)
    assert summary["plugins"]["grad_accum"] == {
        "steps": 4,
        "global_batch_size": 64,
        "effective_batch_size": 64,
    }
    assert summary["effective_batch_size"] == 64
    assert summary["micro_batches"] == 256 // 16
    assert summary["steps"] == 256 // 64  # optimizer steps
    assert summary["samples"] == 256  # samples, not steps


def test_max_steps_counts_optimizer_steps(train):
    summary, _ = train(
        *MLP, "data.batch_size=8", "grad_accum.steps=4", "trainer.max_steps=3", tiny=False
    )
    assert summary["steps"] == 3 and summary["micro_batches"] == 12 and summary["samples"] == 96


class LearningRates:
    """Records the learning rate each optimizer step uses."""

    def __init__(self) -> None:
        self.lrs: list[float] = []

    @hookimpl
    def on_before_optimizer_step(self, optimizer):
        self.lrs.append(optimizer.param_groups[0]["lr"])


def test_lr_schedule_steps_once_per_optimizer_step(train, add_plugin):
    """Cosine over the run's 8 optimizer steps, not over its 32 micro-batches."""
    spy = LearningRates()
    add_plugin(spy)
    summary, _ = train(
        *MLP,
        "data.batch_size=8",
        "grad_accum.steps=4",
        "scheduler=cosine",
        "optimizer.lr=0.1",
        tiny=False,
    )
    steps = 256 // 32
    assert summary["steps"] == steps and summary["micro_batches"] == 4 * steps
    expected = [0.1 * 0.5 * (1 + math.cos(math.pi * i / steps)) for i in range(steps)]
    assert spy.lrs == pytest.approx(expected, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["grad_accum.global_batch_size=100"], "expected a multiple of data.batch_size x "
         "data-parallel processes = 32 x 1 = 32 (e.g. 96 or 128)"),
        (["grad_accum.steps=2", "grad_accum.global_batch_size=128"],
         "grad_accum.steps=2 and grad_accum.global_batch_size=128 disagree"),
        (["+trainer.accumulate_grad_batches=4"], "trainer.accumulate_grad_batches=4 conflicts "
         "with grad_accum (k=1"),
        (["grad_accum.steps=0"], "grad_accum.steps=0 is not allowed: expected an integer >= 1"),
    ],
)  # fmt: skip
def test_bad_settings_are_check_errors(train, overrides, expected):
    with pytest.raises(TuneupError, match="problem") as info:
        train(*overrides)
    assert expected in str(info.value)


def test_settings_given_twice_in_the_same_way_are_accepted(train):
    summary, _ = train("grad_accum.steps=2", "+trainer.accumulate_grad_batches=2")
    assert summary["effective_batch_size"] == 64 and summary["steps"] == 256 // 64


def test_global_batch_size_divides_by_batch_and_world_size():
    assert accumulation_steps(None, 256, batch_size=32, world_size=2) == 4
    assert accumulation_steps(None, None, batch_size=32, world_size=2) == 1
    assert accumulation_steps(4, 256, batch_size=32, world_size=2) == 4
    with pytest.raises(TuneupError, match=r"32 x 2 = 64 \(e.g. 64 or 128\)"):
        accumulation_steps(None, 96, batch_size=32, world_size=2)


class AllReduces:
    """Under DDP: which micro-batches' backward all-reduced gradients (a DDP comm hook)."""

    def __init__(self) -> None:
        self.batch_idx = -1
        self.reduced: list[int] = []

    @hookimpl(trylast=True)
    def configure_trainer(self, kwargs):
        from pytorch_lightning.strategies import DDPStrategy

        # The data modules shard by rank themselves (trainer/sampling.py), hence no sampler swap.
        kwargs.update(
            strategy=DDPStrategy(process_group_backend="gloo"),
            accelerator="cpu",
            use_distributed_sampler=False,
        )

    @hookimpl
    def on_fit_start(self, trainer):
        # Lightning registers comm hooks on CUDA only, so register it here.
        trainer.strategy.model.register_comm_hook(None, self._hook)

    @hookimpl
    def on_train_batch_start(self, batch_idx):
        self.batch_idx = batch_idx

    def _hook(self, state, bucket):
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        self.reduced.append(self.batch_idx)
        return allreduce_hook(state, bucket)


def test_ddp_all_reduces_only_on_the_final_micro_batch(train, add_plugin):
    """DDP on one gloo process (it all-reduces like any world size): Lightning's no_sync."""
    import torch.distributed as dist

    spy = AllReduces()
    add_plugin(spy)
    environ = dict(os.environ)  # Lightning sets MASTER_PORT, WORLD_SIZE...: put them back
    try:
        summary, _ = train(
            *MLP, "data.batch_size=8", "grad_accum.steps=4", "trainer.max_steps=3", tiny=False
        )
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        os.environ.clear()
        os.environ.update(environ)
    assert summary["steps"] == 3 and summary["micro_batches"] == 12
    assert sorted(set(spy.reduced)) == [3, 7, 11]  # the 4th micro-batch of each optimizer step


# -- one effective batch size for every consumer ---------------------------------------------

#: LAMB's linear scaling: lr = 0.001 x effective batch / 32; 256 samples per step -> 0.008.
LAMB = [
    "optimizer=lamb",
    "optimizer.lr=0.001",
    "optimizer.base_batch_size=32",
    "scheduler=constant",
]


@pytest.mark.parametrize("accumulation", ["grad_accum.steps=8", "grad_accum.global_batch_size=256"])
def test_the_lr_is_scaled_to_the_batch_the_summary_reports(train, add_plugin, accumulation):
    """global_batch_size=256 trained LAMB at lr 0.001 (accumulation counted from
    grad_accum.steps only) while the summary said 256."""
    spy = add_plugin(LearningRates())
    summary, _ = train(*MLP, *LAMB, "data.batch_size=32", accumulation, tiny=False)
    assert summary["effective_batch_size"] == 256
    assert summary["plugins"]["grad_accum"]["effective_batch_size"] == 256
    assert summary["optimizer"]["lr"] == pytest.approx(0.008)
    assert spy.lrs == [pytest.approx(0.008)]  # the one step of 8 x 32 samples


@pytest.mark.parametrize("accumulation", [["grad_accum.steps=4"],
                                          ["grad_accum.global_batch_size=256"]])  # fmt: skip
def test_the_world_size_counts_alike_for_every_consumer(make_config, accumulation):
    """Two processes of 32 x 4 micro-batches: 256 per step for the Trainer's k, the summary,
    describe() and the learning rate."""
    from types import SimpleNamespace

    from tuneup.plugins import grad_accum, large_batch
    from tuneup.trainer.components import Plan

    cfg = make_config([*LAMB, "data.batch_size=32", *accumulation])
    assert grad_accum.effective_batch_size(cfg, world_size=2) == 256
    plugin = grad_accum.Plugin(cfg)
    assert plugin.check(cfg, SimpleNamespace(world_size=2), Plan(cfg)) == []
    kwargs = {}
    plugin.configure_trainer(kwargs)
    assert kwargs["accumulate_grad_batches"] == 4
    summary = {"world_size": 2}
    plugin.report(cfg, summary)
    assert summary["effective_batch_size"] == plugin.describe()["effective_batch_size"] == 256
    assert large_batch.scaled_lr(cfg, world_size=2) == pytest.approx(0.008)


def test_a_tensor_parallel_group_counts_as_one_data_parallel_process(make_config):
    """strategy=fsdp on 4 processes with tensor_parallel_size=2: two data shards, so a global
    batch of 256 at 32 per shard is k=4, not 2 (the TP group's ranks share their samples)."""
    from types import SimpleNamespace

    from tuneup.plugins import grad_accum
    from tuneup.trainer.components import Plan

    cfg = make_config(
        [
            "strategy=fsdp",
            "strategy.tensor_parallel_size=2",
            "trainer.devices=4",
            "data.batch_size=32",
            "grad_accum.global_batch_size=256",
        ]
    )
    assert grad_accum.effective_batch_size(cfg, world_size=4) == 256
    plugin = grad_accum.Plugin(cfg)
    assert plugin.check(cfg, SimpleNamespace(world_size=4), Plan(cfg)) == []
    kwargs = {}
    plugin.configure_trainer(kwargs)
    assert kwargs["accumulate_grad_batches"] == 4
    summary = {"world_size": 4}
    plugin.report(cfg, summary)
    assert summary["effective_batch_size"] == plugin.describe()["effective_batch_size"] == 256
