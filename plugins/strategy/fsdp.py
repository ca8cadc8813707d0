"""``strategy=fsdp``: its settings read from the config, and what is wrong with them.

The work is in :mod:`plugins.strategy.parallelize` (the tensor-parallel plan's styles and
checks in :mod:`plugins.strategy.tensor_parallel`); the Lightning strategy that applies it is
:class:`plugins.strategy.build.ModelParallel`. Here: the tensor-parallel plan (the config's
``strategy.tp_plan`` or the model's built-in one) and every problem ``check`` reports before
a process starts: the mesh, the plan against the model built on the meta device, block names,
and the features that cannot run under it.
"""

from __future__ import annotations

from omegaconf import OmegaConf

from tuneup.plugins.strategy.materialize import (
    is_transformers_model,
    seeded_build,
    uninitialised,
)
from tuneup.plugins.strategy.parallelize import Settings, shard_block_names
from tuneup.plugins.strategy.tensor_parallel import STYLES, builtin_plan, plan_problems
from tuneup.trainer.validation import problem


def tp_size(cfg) -> int:
    size = cfg.strategy.get("tensor_parallel_size", 1)
    return size if isinstance(size, int) and size >= 1 else 1


def tp_plan(cfg, model_name: str) -> dict[str, str] | None:
    """The plan the run uses: ``strategy.tp_plan``, else the model's built-in one, else None."""
    given = cfg.strategy.get("tp_plan")
    if given is not None:
        return {str(k): str(v) for k, v in OmegaConf.to_container(given).items()}
    return builtin_plan(model_name, bool(cfg.strategy.get("sequence_parallel", False)))


def problems(cfg, env, plan) -> list[str]:
    """Everything that keeps ``strategy=fsdp`` from running as configured."""
    found, size, world = [], tp_size(cfg), env.world_size
    given = cfg.strategy.get("tp_plan")
    if given is not None and not (
        OmegaConf.is_dict(given) and all(isinstance(v, str) for v in given.values())
    ):
        return [
            problem(
                "strategy.tp_plan",
                given,
                f"a mapping of module-name patterns to {'|'.join(STYLES)}, e.g. "
                "{blocks.*.up: colwise, blocks.*.down: rowwise}, or null",
            )
        ]
    if world % size:
        found.append(
            f"strategy.tensor_parallel_size={size} does not divide the {world} process(es) "
            f"(trainer.devices x trainer.num_nodes): use a size that divides {world}, or "
            f"trainer.devices={size} (tensor parallelism alone)"
        )
    blocks = cfg.strategy.get("shard_blocks")
    if blocks is not None and not (
        OmegaConf.is_list(blocks) and len(blocks) and all(isinstance(b, str) for b in blocks)
    ):
        found.append(
            problem(
                "strategy.shard_blocks",
                blocks,
                "a list of block class names, e.g. [Block], or null",
            )
        )
        blocks = None
    if cfg.strategy.get("sequence_parallel") and given is not None:
        found.append(
            "strategy.sequence_parallel=true applies to a built-in plan; with strategy.tp_plan "
            "name the norms yourself: {...: sequence_parallel} (and shard_sequence / "
            "gather_sequence where the sequence-sharded part begins and ends)"
        )
    if plan is None or not plan.sound:
        return found
    if plan.lightning:
        found.append(
            f"strategy=fsdp with model=lightning: tuneup parallelises an nn.Module it builds "
            f"({plan.model_name} is a LightningModule, which parallelises itself in "
            "configure_model under Lightning's ModelParallelStrategy); use model=custom with "
            "your nn.Module, or strategy=ddp"
        )
        return found
    if cfg.strategy.get("cpu_offload") and not env.is_cuda:
        found.append(
            f"strategy.cpu_offload=true keeps the sharded parameters, gradients and optimizer "
            f"state in CPU memory instead of the GPU's; on {env.accelerator} they are there "
            "already (FSDP2's offload needs CUDA): set strategy.cpu_offload=false"
        )
    kernels = OmegaConf.select(cfg, "kernels.ops", default=None)
    if kernels and "linear_cross_entropy" in kernels:
        found.append(
            "kernels=[linear_cross_entropy] with strategy=fsdp: the fused output layer and loss "
            "reads the output layer's weight after the model's forward, when FSDP has sharded "
            "it again; use kernels=[cross_entropy] (the loss alone) or kernels=[]"
        )
    if size > 1 and kernels:
        found.append(
            f"kernels={list(kernels)} with strategy.tensor_parallel_size={size}: the fused "
            "loss kernels need the whole output head on each process, which tensor "
            "parallelism splits; use kernels=[] or tensor_parallel_size=1"
        )
    clip = OmegaConf.select(cfg, "trainer.gradient_clip_val", default=None)
    if size > 1 and clip and OmegaConf.select(cfg, "trainer.gradient_clip_algorithm") != "value":
        found.append(
            f"trainer.gradient_clip_val={clip} with strategy.tensor_parallel_size={size}: "
            "Lightning's clipping by norm cannot add norms of tensors on different meshes; "
            f"use optimizer.clip_grad_norm={clip} (the same clipping, across meshes)"
        )
    model = plan.meta_model()
    if model is None:
        return found
    if missing := uninitialised(cfg.strategy.get("init", "auto"), model):
        found.append(
            f"strategy.init=reset_parameters: {', '.join(missing)} of {plan.model_name} "
            "has parameters but no reset_parameters() to initialise them; use "
            "strategy.init=broadcast (rank 0 builds the model and sends each process its shards)"
        )
    if cfg.strategy.get("init") == "hf" and not is_transformers_model(model):
        found.append(
            f"strategy.init=hf: {plan.model_name} ({type(model).__name__}) is not a transformers "
            "model (no _init_weights); use strategy.init=auto (broadcast for it)"
        )
    if blocks is not None and not shard_block_names(model, list(blocks)):
        classes = sorted({type(m).__name__ for m in model.modules()})
        found.append(
            problem(
                "strategy.shard_blocks",
                list(blocks),
                f"class names of {plan.model_name}'s blocks (its classes: {', '.join(classes)})",
            )
        )
    if size > 1 and not world % size:  # the plan is judged for a mesh that can exist
        chosen = tp_plan(cfg, plan.model_name)
        if chosen is None:
            found.append(
                f"strategy.tensor_parallel_size={size}: {plan.model_name} has no built-in "
                "tensor-parallel plan; give one: strategy.tp_plan='{blocks.*.up: colwise, "
                "blocks.*.down: rowwise}' (module-name patterns, docs/distributed.md)"
            )
        else:
            heads = cfg.model.get("heads") if plan.model_name == "gpt" else None
            found += plan_problems(model, chosen, size, heads)
    return found


def settings(cfg, model_name: str, build=None, weights=None) -> Settings:
    """What :func:`plugins.strategy.parallelize.parallelize` does for this config; ``build``:
    the model's builder (``Plan.build_model``), called on rank 0 by ``strategy.init=broadcast``;
    ``weights``: what fills the shards instead (``Plan.weights``: model=huggingface's)."""
    node = cfg.strategy
    blocks = node.get("shard_blocks")
    compile_node = cfg.get("compile") or {}
    compile_options = None
    if compile_node.get("plugin"):
        keys = ("mode", "fullgraph", "dynamic", "backend")
        compile_options = {k: compile_node.get(k) for k in keys if k in compile_node}
    return Settings(
        tp_plan=(tp_plan(cfg, model_name) or {}) if tp_size(cfg) > 1 else {},
        shard_blocks=list(blocks) if blocks is not None else None,
        reshard_after_forward=bool(node.get("reshard_after_forward", True)),
        cpu_offload=bool(node.get("cpu_offload", False)),
        compile_options=compile_options,
        init=str(node.get("init", "auto")),
        seed=int(cfg.get("seed", 0)),
        build=seeded_build(build, int(cfg.get("seed", 0))) if build is not None else None,
        weights=weights,
    )
