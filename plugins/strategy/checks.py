"""What ``check`` finds in ``strategy=`` before a run, and what a run's layout does that its
strategy does not say.

:func:`settings_problems`: the keys each strategy takes and their values, a
``trainer.strategy`` that conflicts, a ``strategy=ddp`` of one process, ``strategy=fsdp``'s
mesh and tensor-parallel plan (:mod:`plugins.strategy.fsdp`), the Slurm task layout
(:mod:`plugins.strategy.slurm`). :func:`layout_note`: one process where the strategy names
several, or more CPU processes than cores. The plugin, which runs both, is this package's
``__init__``.
"""

from __future__ import annotations

import torch

from tuneup.plugins.strategy import fsdp, slurm
from tuneup.plugins.strategy.build import COMM_HOOKS
from tuneup.plugins.strategy.materialize import INITS
from tuneup.trainer.environment import Environment, usable_cpus
from tuneup.trainer.validation import BOOL, Integer, Number, OneOf, problems

COMMON = {"plugin", "name", "timeout_s", "join_timeout_s"}
KEYS = {
    "auto": COMMON,
    "ddp": COMMON | {"find_unused_parameters", "static_graph", "gradient_as_bucket_view",
                     "bucket_cap_mb", "comm_hook", "count_allreduces"},
    "fsdp": COMMON | {"shard_blocks", "reshard_after_forward", "cpu_offload",
                      "tensor_parallel_size", "tp_plan", "sequence_parallel", "checkpoint",
                      "init"},
}  # fmt: skip
RULES = {
    "strategy.name": OneOf(tuple(KEYS)),
    "strategy.timeout_s": Number(gt=0),
    "strategy.join_timeout_s": Number(gt=0),
    "strategy.find_unused_parameters": BOOL,
    "strategy.static_graph": BOOL,
    "strategy.gradient_as_bucket_view": BOOL,
    "strategy.bucket_cap_mb": Number(gt=0),
    "strategy.comm_hook": OneOf(tuple(COMM_HOOKS)),
    "strategy.count_allreduces": BOOL,
    "strategy.cpu_offload": BOOL,
    "strategy.reshard_after_forward": BOOL,
    "strategy.sequence_parallel": BOOL,
    "strategy.tensor_parallel_size": Integer(low=1),
    "strategy.checkpoint": OneOf(("sharded", "full")),
    "strategy.init": OneOf(INITS),
}


def settings_problems(cfg, env: Environment, plan=None) -> list[str]:
    """Problems with ``cfg.strategy`` on this machine: keys, values, world size, device, and
    (``strategy=fsdp``) the mesh and tensor-parallel plan against ``plan``'s model."""
    node, name = cfg.strategy, cfg.strategy.get("name")
    found = problems(cfg, RULES)
    if name not in KEYS:
        return found
    found += [
        f"strategy.{key} is not a setting of strategy={name}; allowed: "
        f"{', '.join(sorted(KEYS[name] - {'plugin'}))}"
        for key in node
        if key not in KEYS[name]
    ]
    if cfg.trainer.get("strategy") is not None:
        found.append(
            f"trainer.strategy={cfg.trainer.strategy} conflicts with strategy={name}: choose the "
            "strategy with the strategy group (strategy=ddp) and remove trainer.strategy"
        )
    if name == "ddp" and env.world_size < 2 and cfg.trainer.get("devices") != "auto":
        found.append(
            f"strategy=ddp with trainer.devices={env.devices} and trainer.num_nodes="
            f"{env.num_nodes} is one process: nothing to distribute. Set trainer.devices=2 "
            "(or more; on CPU each device is a process), trainer.devices=auto (every GPU of "
            "the node), or use strategy=auto"
        )
    if name == "fsdp":
        found += fsdp.problems(cfg, env, plan)
    return found + slurm.task_problems(env.devices, env.num_nodes)


def layout_note(cfg, env: Environment) -> str | None:
    """What the run does that its strategy does not say: one process for strategy=ddp|fsdp on a
    machine with one device, or more CPU processes than cores."""
    name, given = cfg.strategy.name, cfg.trainer.get("devices")
    if name != "auto" and env.world_size == 1:
        if given == "auto":
            where = f"{torch.cuda.device_count()} GPU" if env.is_cuda else env.accelerator
            return (
                f"strategy={name} with trainer.devices=auto on {where}: one device, so one "
                "process; set trainer.devices=N to start N processes"
            )
        return (
            f"strategy={name} with trainer.devices={given}: one process (FSDP over a mesh "
            "of one); set trainer.devices=N to start N processes"
        )
    cpus = usable_cpus()
    if not env.is_cuda and env.devices > cpus:
        return (
            f"{env.devices} processes on {cpus} CPU core(s): each gets less than a core, so "
            f"expect it slower than trainer.devices={cpus}"
        )
    return None
