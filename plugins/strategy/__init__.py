"""How a run is spread over processes: ``strategy=auto|ddp|fsdp`` (docs/distributed.md, docs/slurm.md).

``trainer.devices`` processes per node times ``trainer.num_nodes`` nodes make the
world. ``auto`` trains in one process when the world is 1 and with DDP (the
defaults of ``strategy=ddp``) otherwise; ``ddp`` replicates the model and averages
gradients (torch ``DistributedDataParallel``); ``fsdp`` shards parameters,
gradients and optimizer state (FSDP2) and, with ``tensor_parallel_size`` > 1, splits
the blocks' matmuls (:mod:`plugins.strategy.fsdp`, :mod:`plugins.strategy.parallelize`,
:mod:`plugins.strategy.tensor_parallel`).
Lightning does the work (:mod:`plugins.strategy.build`); this plugin picks the backend
(gloo on CPU, NCCL
on CUDA), a short collective timeout and a long one for joining (:mod:`plugins.strategy.join`),
and fixes what Lightning gets wrong with
Hydra multiruns (:mod:`plugins.strategy.launch`).

Data: every process trains on its own shard of each epoch, chosen by the data
module's sampler (trainer/state/data_order.py: data shard ``r`` of ``W`` takes every
W-th index of the epoch's permutation; the shards are the data-parallel ranks), so W processes with batch b see, step by step, the
samples one process with batch W x b sees, and DDP's averaged gradient is that
batch's gradient.

In a Slurm job the ranks come from Slurm, and rank 0 requeues the job after a
SIGUSR1 checkpoint (:mod:`plugins.strategy.slurm`, the one owner of requeue).
With ``count_allreduces=true`` (DDP) the summary reports ``gradient_allreduces``:
backward passes whose gradients were all-reduced (accumulation skips them on
non-final micro-batches). Every run's summary has ``per_rank``: what each process
holds and sends (:mod:`plugins.strategy.memory`).

This module holds the plugin: the Trainer's strategy (:func:`build_strategy`), what a run
resolves to, and the hooks that measure each process and requeue a Slurm job;
:mod:`plugins.strategy.checks` what ``check`` finds in the settings.
"""

from __future__ import annotations

import logging

import torch
from omegaconf import OmegaConf

from tuneup import hookimpl
from tuneup.errors import TuneupError
from tuneup.plugins.measure.memory import peak_memory
from tuneup.plugins.strategy import fsdp, memory, slurm
from tuneup.plugins.strategy.build import (
    AllReduceCount,
    backend,
    ddp_strategy,
    model_parallel_strategy,
)
from tuneup.plugins.strategy.checks import layout_note, settings_problems
from tuneup.plugins.strategy.materialize import reason
from tuneup.trainer import console
from tuneup.trainer.environment import Environment, cpus_per_process
from tuneup.trainer.state.preemption import Preempted, SignalFlag

log = logging.getLogger(__name__)

#: What strategy=auto uses when the world has more than one process: strategy=ddp's defaults.
DDP_DEFAULTS = {
    "comm_hook": "none",
    "find_unused_parameters": False,
    "static_graph": False,
    "gradient_as_bucket_view": False,
    "bucket_cap_mb": 25,
}


def build_strategy(
    cfg,
    env: Environment,
    count: AllReduceCount | None,
    model_name: str = "",
    build=None,
    weights=None,
):
    """The ``strategy`` Trainer argument: "auto" (one process) or a Lightning strategy object;
    ``build``: the model's builder, for ``strategy.init=broadcast`` (rank 0 builds it whole)."""
    node, name = cfg.strategy, cfg.strategy.name
    if name == "fsdp":
        parallel = fsdp.settings(cfg, model_name, build, weights)
        return model_parallel_strategy(node, env.accelerator, env.world_size, parallel)
    if name == "ddp":
        return ddp_strategy(node, env.accelerator, count=count)
    if env.world_size > 1:
        return ddp_strategy(OmegaConf.merge(DDP_DEFAULTS, node), env.accelerator)
    return "auto"


def resolved(name: str, world_size: int) -> str:
    """What ``strategy=<name>`` runs with this many processes: single process, ddp or fsdp.
    strategy=fsdp is fsdp in one process too: its model is sharded over a mesh of one, computes
    in the strategy's mixed precision and saves sharded checkpoints; ddp in one process is
    plain training."""
    if name == "fsdp":
        return name
    return "ddp" if world_size > 1 else "single process"


def requeue_signal_received(trainer) -> bool:
    """Whether the checkpoint plugin stopped the run on the requeue signal (not on SIGTERM)."""
    flags = [getattr(c, "signals", None) for c in trainer.callbacks]
    return any(isinstance(f, SignalFlag) and f.received == slurm.REQUEUE_SIGNAL for f in flags)


class Plugin:
    def __init__(self, cfg) -> None:
        self.cfg = cfg
        self.env: Environment | None = None
        self.strategy = None
        self.count = AllReduceCount() if cfg.strategy.get("count_allreduces") else None
        self.cluster = "slurm" if slurm.in_slurm_job() else "local"
        self.requeued: str | None = None
        self.model_name = ""
        self.collectives: memory.Collectives | None = None  # counting one step's collectives
        self.counted: dict | None = None
        self.held: dict | None = None
        self.per_rank: list[dict] | None = None
        self.first_step: int | None = None
        self.plan = None
        self.init: str | None = None  # strategy=fsdp: how the model is initialised, and why

    @hookimpl
    def check(self, cfg, env, plan):
        self.env = env
        self.model_name = plan.model_name if plan is not None else ""
        self.plan = plan
        found = settings_problems(cfg, env, plan)
        if not found and console.process_rank() == "0" and (note := layout_note(cfg, env)):
            log.warning("%s", note)  # once: every process runs the checks
        model = plan.meta_model() if plan is not None and not found else None
        if cfg.strategy.name == "fsdp" and model is not None:
            self.init = reason(cfg.strategy.get("init", "auto"), model)
            if plan.weights is not None:  # model=huggingface: its checkpoint, shard by shard
                self.init = f"the pretrained weights of model.path={cfg.model.path}"
            said = (
                f"the model is built empty on each process and its shards initialised by "
                f"{self.init}"
                if not self.init.startswith("full")
                else "every process builds the whole model (strategy.init=full)"
            )
            if console.process_rank() == "0":
                console.say(f"strategy=fsdp: {said}", log)
        return found

    @hookimpl
    def configure_trainer(self, cfg, kwargs):
        env = self.env or Environment.from_config(cfg)
        for line in slurm.lone_node_problems(env.num_nodes):  # here, not in check: an autotune
            raise TuneupError(line)  # checks a Slurm job's candidates outside the job
        build = self.plan.build_model if self.plan is not None else None
        weights = self.plan.weights if self.plan is not None else None  # model=huggingface's
        self.strategy = build_strategy(cfg, env, self.count, self.model_name, build, weights)
        kwargs["strategy"] = self.strategy
        kwargs["devices"] = env.devices  # "auto" resolved as tuneup means it (environment.py)
        environment = slurm.cluster_environment()
        if environment is not None:
            kwargs["plugins"] = [*(kwargs.get("plugins") or []), environment]

    @hookimpl
    def on_fit_start(self, trainer):
        # Several CPU processes: each its share of the cores (torch would give each all of
        # them, and they would fight over them), as torchrun does with OMP_NUM_THREADS.
        if trainer.world_size > 1 and not (self.env and self.env.is_cuda):
            torch.set_num_threads(cpus_per_process(self.env.devices if self.env else 1))

    @hookimpl
    def on_train_batch_start(self, trainer):
        # The run's first optimizer step is measured (a resumed run's first is where its
        # checkpoint stopped): its collectives, then what each process holds after it.
        if self.first_step is None:
            self.first_step = trainer.global_step
            if trainer.world_size > 1:
                self.collectives = memory.Collectives()
                self.collectives.__enter__()

    @hookimpl
    def on_train_batch_end(self, trainer, module):
        if self.held is None and trainer.global_step > self.first_step:  # the step is done
            self._stop_counting()
            self.counted = self.collectives.figures() if self.collectives else {}
            self.held = memory.held_bytes(module, trainer.optimizers)  # gradients still there

    def _stop_counting(self) -> None:
        if self.collectives is not None and self.counted is None:
            self.collectives.__exit__(None, None, None)

    @hookimpl
    def on_fit_end(self, trainer, module):
        self._stop_counting()
        figures = {
            **(self.held or memory.held_bytes(module, trainer.optimizers)),
            "peak_memory_bytes": peak_memory(trainer.strategy.root_device),
            **(self.counted or {}),
        }
        self.per_rank = memory.gather(trainer, figures)

    @hookimpl
    def on_exception(self, trainer, exception):
        self._stop_counting()
        if (
            isinstance(exception, Preempted)
            and trainer.is_global_zero
            and slurm.in_slurm_job()
            and requeue_signal_received(trainer)
        ):
            self.requeued = slurm.requeue_at_exit()

    @hookimpl
    def report(self, summary):
        if self.count is not None:
            summary["gradient_allreduces"] = self.count.rounds
        if self.requeued:
            summary["requeued_job"] = self.requeued
        if self.per_rank is not None:
            summary["per_rank"] = [{"rank": r, **f} for r, f in enumerate(self.per_rank)]

    def describe(self):
        env = self.env or Environment.from_config(self.cfg)
        node = OmegaConf.to_container(self.cfg.strategy, resolve=True)
        node.pop("plugin", None)
        described = {
            **node,
            "used": resolved(node["name"], env.world_size),
            "backend": backend(env.accelerator) if env.world_size > 1 else None,
            "world_size": env.world_size,
            "cluster": self.cluster,
        }
        if env.world_size > 1 and not env.is_cuda:
            described["threads_per_process"] = cpus_per_process(env.devices)
        if note := layout_note(self.cfg, env):
            described["note"] = note
        layout = getattr(self.strategy, "layout", None)
        if layout is not None:  # strategy=fsdp, once the model was parallelised
            size = node.get("tensor_parallel_size", 1)
            described |= {
                "mesh": {"data_parallel": env.world_size // size, "tensor_parallel": size},
                "sharded_blocks": len(layout.sharded_blocks),
                "tensor_parallel_modules": len(layout.tensor_parallel),
                "compiled_blocks": len(layout.compiled_blocks),
                "mixed_precision": str(self.strategy.settings.param_dtype or "off"),
                "initialised_by": layout.init or "a whole build on each process",
            }
        return described
