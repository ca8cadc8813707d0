"""Tensor parallelism: the plan (module-name patterns -> styles), what is wrong with it, and
applying it with torch's ``parallelize_module``.

Step 1 of ``strategy=fsdp`` (:func:`plugins.strategy.parallelize.parallelize` runs it first,
then per-block compile and FSDP2). The plan maps module-name patterns (``fnmatch``:
``transformer.h.*.mlp.c_fc``) to a style: ``colwise`` (the weight's output features split
over the tensor-parallel group, the output stays sharded) or ``rowwise`` (input features
split, the outputs summed: one all-reduce), through ``ColwiseParallel`` / ``RowwiseParallel``.
``sequence_parallel`` (norms) shards the activations between those on the sequence dimension
(``SequenceParallel``); the layers around it then take and give sequence-sharded activations.
``model=gpt`` has a built-in plan (:data:`GPT_PLAN`).

The plan's checks live beside its application because both read a module the same way (which
dimension a style splits, transformers' ``Conv1D`` stored transposed): ``check`` reports on the
model built on the meta device what the split would meet on the real one.
"""

from __future__ import annotations

import fnmatch
import functools

from torch import nn

#: ``shard_sequence`` / ``gather_sequence``: where sequence parallelism begins and ends (the
#: module's input is split on the sequence dimension / gathered whole again).
STYLES = ("colwise", "rowwise", "sequence_parallel", "shard_sequence", "gather_sequence")

#: The built-in plan of ``model=gpt`` (zoo/models/gpt.py): Megatron's split of each block.
#: The attention's fused q, k, v matmul is laid out head by head, so a column split keeps
#: whole heads on each process; embeddings, norms and the tied head stay whole.
GPT_PLAN = {
    "transformer.h.*.attn.c_attn": "colwise",
    "transformer.h.*.attn.c_proj": "rowwise",
    "transformer.h.*.mlp.c_fc": "colwise",
    "transformer.h.*.mlp.c_proj": "rowwise",
}
GPT_SEQUENCE_PARALLEL = {
    "transformer.h.0": "shard_sequence",
    "transformer.h.*.ln_1": "sequence_parallel",
    "transformer.h.*.ln_2": "sequence_parallel",
    "transformer.ln_f": "gather_sequence",
}


# --------------------------------------------------------------------------------------
# the plan: patterns -> module names, and what is wrong with it
# --------------------------------------------------------------------------------------


def expand(model: nn.Module, plan: dict[str, str]) -> dict[str, str]:
    """The plan with each pattern replaced by the names of the modules it matches."""
    names = [name for name, _ in model.named_modules() if name]
    expanded: dict[str, str] = {}
    for pattern, style in plan.items():
        for name in names:
            if fnmatch.fnmatchcase(name, pattern):
                expanded[name] = style
    return expanded


def plan_problems(
    model: nn.Module, plan: dict, tp_size: int, heads: int | None = None
) -> list[str]:
    """Problems with a tensor-parallel plan for ``model``: bad styles, patterns that match no
    module, modules a style cannot split, dimensions ``tp_size`` does not divide."""
    found = []
    for pattern, style in plan.items():
        if style not in STYLES:
            found.append(
                f"strategy.tp_plan: {pattern}: {style!r} is not allowed: expected one of "
                f"{', '.join(STYLES)}"
            )
            continue
        matches = expand(model, {pattern: style})
        if not matches:
            found.append(
                f"strategy.tp_plan: {pattern} matches no module of the model; its modules "
                f"include {', '.join(_sample_names(model))}"
            )
        split = [
            p
            for name in matches
            for p in _split_problems(name, model.get_submodule(name), style, tp_size)
        ]
        if split:  # the first module of the pattern that cannot be split says why
            more = f" (and {len(split) - 1} more module(s) of {pattern})" if len(split) > 1 else ""
            found.append(split[0] + more)
    if heads is not None and heads % tp_size:
        found.append(
            f"strategy.tensor_parallel_size={tp_size} does not divide model.heads={heads}: "
            "each process must hold whole attention heads"
        )
    return found


def _split_problems(name: str, module: nn.Module, style: str, tp_size: int) -> list[str]:
    if style in ("shard_sequence", "gather_sequence"):
        return []
    if style == "sequence_parallel":
        if not isinstance(module, nn.LayerNorm | nn.RMSNorm | nn.Dropout):
            return [
                f"strategy.tp_plan: {name} is a {type(module).__name__}; sequence_parallel "
                "applies to norms (LayerNorm, RMSNorm) and dropout"
            ]
        return []
    if not (isinstance(module, nn.Linear | nn.Embedding) or is_conv1d(module)):
        return [
            f"strategy.tp_plan: {name} is a {type(module).__name__}; {style} splits "
            "nn.Linear, nn.Embedding and transformers' Conv1D layers"
        ]
    # colwise splits a layer's output features, rowwise its input features; a Linear's weight
    # is [out, in], a Conv1D's [in, out], an Embedding's [vocabulary, embedding].
    out_dim = 1 if is_conv1d(module) else 0
    dim = out_dim if style == "colwise" else 1 - out_dim
    if isinstance(module, nn.Embedding):
        dim = 1 if style == "colwise" else 0
        what = "embedding" if dim == 1 else "vocabulary"
    else:
        what = "output" if dim == out_dim else "input"
    size = module.weight.shape[dim]
    if size % tp_size:
        return [
            f"strategy.tensor_parallel_size={tp_size} does not divide the {size} {what} "
            f"features of {name} ({style}): choose a size that divides {size}"
        ]
    return []


def _sample_names(model: nn.Module, count: int = 6) -> list[str]:
    names = [name for name, m in model.named_modules() if name and isinstance(m, nn.Linear)]
    return names[:count] or [name for name, _ in model.named_modules() if name][:count]


def builtin_plan(model_name: str, sequence_parallel: bool) -> dict[str, str] | None:
    if model_name != "gpt":
        return None
    return {**GPT_PLAN, **(GPT_SEQUENCE_PARALLEL if sequence_parallel else {})}


# --------------------------------------------------------------------------------------
# applying it: torch's styles over the tensor-parallel group
# --------------------------------------------------------------------------------------


def apply_tensor_parallel(model: nn.Module, mesh, plan: dict[str, str]) -> dict[str, str]:
    """Split the modules ``plan`` names over ``mesh`` (1-D, the tensor-parallel group).

    With ``sequence_parallel`` entries the norms take and give activations sharded on the
    sequence dimension (dim 1), so the colwise layers gather them first and the rowwise
    layers reduce-scatter into them; without, activations between blocks are whole.
    """
    from torch.distributed.tensor.parallel import parallelize_module

    expanded = expand(model, plan)
    sequence = "sequence_parallel" in expanded.values()
    parallelize_module(model, mesh, {name: _style(s, sequence) for name, s in expanded.items()})
    return expanded


def is_conv1d(module: nn.Module) -> bool:
    """transformers' ``Conv1D`` (GPT-2's linear layers): ``x @ weight + bias`` with the weight
    stored ``[in, out]``, the transpose of ``nn.Linear``'s."""
    return type(module).__name__ == "Conv1D" and hasattr(module, "nf")


def _distribute(module: nn.Module, mesh, placements: dict, src_data_rank) -> None:
    from torch.distributed.tensor import distribute_tensor

    for name, placement in placements.items():
        param = getattr(module, name, None)
        if param is not None:
            shard = distribute_tensor(param, mesh, [placement], src_data_rank=src_data_rank)
            module.register_parameter(name, nn.Parameter(shard, param.requires_grad))


@functools.cache
def _styles():
    """torch's column and row styles, taught transformers' ``Conv1D`` (its weight transposed).
    Made once, on first use: torch.distributed's tensor parallelism is imported only then."""
    from functools import partial

    from torch.distributed.tensor import Replicate, Shard, distribute_module
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    def on_conv1d(style, module, device_mesh, split: dict):
        """``style`` applied to a Conv1D: its parameters split as ``split`` says, its input and
        output laid out as the style lays out a Linear's."""
        return distribute_module(
            module,
            device_mesh,
            lambda _, m, mesh: _distribute(m, mesh, split, style.src_data_rank),
            partial(style._prepare_input_fn, style.input_layouts, style.desired_input_layouts),
            partial(style._prepare_output_fn, style.output_layouts, style.use_local_output),
        )

    class Colwise(ColwiseParallel):
        def _apply(self, module, device_mesh):
            if not is_conv1d(module):
                return super()._apply(module, device_mesh)
            return on_conv1d(self, module, device_mesh, {"weight": Shard(1), "bias": Shard(0)})

    class Rowwise(RowwiseParallel):
        def _apply(self, module, device_mesh):
            if not is_conv1d(module):
                return super()._apply(module, device_mesh)
            self.desired_input_layouts = (Shard(-1),)  # as RowwiseParallel sets for a Linear
            split = {"weight": Shard(0), "bias": Replicate()}
            return on_conv1d(self, module, device_mesh, split)

    return Colwise, Rowwise


def _style(style: str, sequence: bool):
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import PrepareModuleInput, SequenceParallel

    ColwiseParallel, RowwiseParallel = _styles()

    if style == "sequence_parallel":
        return SequenceParallel()
    if style in ("shard_sequence", "gather_sequence"):
        whole, split = (Replicate(),), (Shard(1),)
        before, after = (whole, split) if style == "shard_sequence" else (split, whole)
        return PrepareModuleInput(
            input_layouts=before, desired_input_layouts=after, use_local_output=True
        )
    if style == "colwise":
        return ColwiseParallel(input_layouts=Shard(1)) if sequence else ColwiseParallel()
    return RowwiseParallel(output_layouts=Shard(1)) if sequence else RowwiseParallel()
