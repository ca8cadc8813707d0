"""A Hugging Face directory from tuneup's weights: what ``from_pretrained(DIR)`` loads.

``config.json`` (and ``generation_config.json`` for a model that generates), the weights as
``model-0000i-of-0000N.safetensors`` and ``model.safetensors.index.json`` naming each tensor's
file. The tensors are those ``save_pretrained`` writes: the model's ``state_dict`` without
the tied copies (GPT-2's ``lm_head.weight``, which ``from_pretrained`` ties back to
``transformer.wte.weight``) and ``_keys_to_ignore_on_save``. Two ways to it:

- :func:`export` (``checkpoint.export=hf``, at the end of training; collective): every rank
  writes its own part of every tensor through DCP's ``HuggingFaceStorageWriter``
  (``save_distributed``), then each rank assembles the output files assigned to it from those
  parts (DCP's ``consolidate_safetensors_files_on_every_rank``, one full tensor at a time;
  the parts are read from the run's file system, which the ranks share as for checkpoints).
  No process ever holds the whole model: torchtitan's ``last_save_in_hf``.
- :func:`write` (``tuneup-consolidate --format hf``; one process): output file by output
  file, only that file's tensors read (DCP reads just those from a sharded checkpoint), so
  the peak is one file's tensors (:data:`MAX_FILE_BYTES`), not the model.

Both write under a temporary name beside the directory and rename it into place. The model
must be a transformers ``PreTrainedModel`` whose weights load as they are in memory: a
transformers 5 class that converts its checkpoint's layout on load (fused experts...) is
refused rather than written in a layout ``from_pretrained`` would misread.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import struct
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

from tuneup.errors import TuneupError

INDEX = "model.safetensors.index.json"
EXPORT_DIR = "hf"  # checkpoint.export=hf writes <run dir>/hf
#: Bytes of tensors per output file at most (a tensor larger than this gets a file alone):
#: transformers 4's ``max_shard_size`` default; also the CLI's peak of memory.
MAX_FILE_BYTES = 5 * 10**9
ALLOWED = "model=custom or model=huggingface with a transformers PreTrainedModel"


def hf_class(model) -> type | None:
    """The transformers class of ``model`` (not FSDP2's subclass of it); None if it has none."""
    try:
        from transformers import PreTrainedModel
    except ImportError:
        return None
    from torch.distributed.fsdp import FSDPModule

    return next(
        (
            c
            for c in type(model).__mro__
            if issubclass(c, PreTrainedModel) and not issubclass(c, FSDPModule)
        ),
        None,
    )


def model_problem(model, what: str) -> str | None:
    """Why ``model`` cannot be written as a Hugging Face directory (``what`` names the
    setting asking for it), or None."""
    if hf_class(model) is None:
        name = f"{type(model).__module__}.{type(model).__qualname__}"
        return (
            f"{what} writes a transformers PreTrainedModel; the run's model is {name}. "
            f"Allowed: {ALLOWED}, or write the torch state dict (tuneup-consolidate)"
        )
    if converts_weights(model):
        return (
            f"{what}: {hf_class(model).__name__} converts its checkpoint's weights on load "
            "(transformers' conversion mapping), which this export does not reverse; use "
            "tuneup-consolidate (torch state dict) and the model's own save_pretrained"
        )
    return None


def export_problems(cfg, plan) -> list[str]:
    """``checkpoint.export=hf`` with a model it cannot write, found before training where the
    model builds on the meta device (else :func:`export` says so when training ends)."""
    if cfg.checkpoint.get("export", "none") != "hf":
        return []
    if plan.lightning:
        return [
            f"checkpoint.export=hf writes a transformers PreTrainedModel, not model=lightning "
            f"(the user's LightningModule). Allowed: {ALLOWED}"
        ]
    model = plan.meta_model()
    problem = None if model is None else model_problem(model, "checkpoint.export=hf")
    return [problem] if problem else []


def converts_weights(model) -> bool:
    """Whether transformers 5 maps this class's checkpoint layout to another in memory."""
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import PrefixChange
    except ImportError:  # transformers 4: checkpoints load as they are
        return False
    mapping = get_model_conversion_mapping(model, add_legacy=False) or []
    return any(not isinstance(c, PrefixChange) for c in mapping)


def saved_keys(model) -> list[str]:
    """The ``state_dict`` keys ``save_pretrained`` writes, in order: of names sharing one
    tensor, those the class declares tied (``_tied_weights_keys``) are left out, one name
    always kept (transformers' ``remove_tied_weights_from_state_dict``, by identity here:
    that also holds for sharded and meta tensors); ``_keys_to_ignore_on_save`` too."""
    declared = [
        f"{name}.{key}" if name else key
        for name, module in model.named_modules()
        for key in (getattr(module, "_tied_weights_keys", None) or ())
    ]
    state = model.state_dict(keep_vars=True)
    names_of: dict[int, list[str]] = {}
    for name, value in state.items():
        names_of.setdefault(id(value), []).append(name)
    dropped = set(getattr(model, "_keys_to_ignore_on_save", None) or ())
    for names in names_of.values():
        tied = [n for n in sorted(names) if any(re.search(p, n) for p in declared)]
        dropped.update(tied[: len(names) - 1])
    return [key for key in state if key not in dropped and torch.is_tensor(state[key])]


def file_plan(sizes: dict[str, int], at_least: int = 1) -> dict[str, int]:
    """Each tensor's output file (1..N), in order: N files of about equal bytes, at least
    ``at_least`` (one per rank, so that every rank writes one) and none above
    :data:`MAX_FILE_BYTES` but for a tensor larger alone."""
    total = sum(sizes.values()) or 1
    count = max(1, min(len(sizes), max(at_least, -(-total // MAX_FILE_BYTES))))
    target, plan, index, filled = total / count, {}, 1, 0
    for name, size in sizes.items():
        more = filled + size > MAX_FILE_BYTES or (filled + size > target and index < count)
        if filled and more:  # (uneven sizes may take a file more than count)
            index, filled = index + 1, 0
        plan[name], filled = index, filled + size
    return plan


def check_out(out: Path) -> None:
    """Refuse to replace what is not an earlier export (the rename would delete it)."""
    if out.exists() and not (out.is_dir() and (not any(out.iterdir()) or (out / INDEX).is_file())):
        raise TuneupError(
            f"{out} exists and is not a Hugging Face directory written before "
            f"(no {INDEX}): give a new or empty directory"
        )


def file_name(index: int, count: int) -> str:
    return f"model-{index:05d}-of-{count:05d}.safetensors"  # save_pretrained's names


def write_config(model, directory: Path, dtype: torch.dtype) -> None:
    """``config.json`` as ``save_pretrained`` writes it (its class as the architecture, the
    weights' dtype) and ``generation_config.json`` for a model that generates."""
    cls = hf_class(model)
    config = copy.deepcopy(model.config)
    config.architectures = [cls.__name__]
    config.dtype = str(dtype).removeprefix("torch.")
    config.save_pretrained(directory)
    if cls.can_generate() and getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(directory)


def floating_dtype(tensors) -> torch.dtype:
    return next((t.dtype for t in tensors if t.is_floating_point()), torch.float32)


# -- the end of a run: every rank writes ---------------------------------------------------


def export(trainer, model, path: Path) -> Path:
    """Write ``model`` (the run's, plain or sharded) to the directory ``path``, replacing an
    earlier export there. Collective: every rank calls it."""
    import torch.distributed as dist
    from torch.distributed.checkpoint import HuggingFaceStorageWriter, save
    from torch.distributed.checkpoint._consolidate_hf_safetensors import (
        consolidate_safetensors_files,
        consolidate_safetensors_files_on_every_rank,
    )

    from tuneup.trainer.state.checkpoint_write import fsync_directory
    from tuneup.trainer.state.sharded import TEMP_MARK, replace

    strategy, first = trainer.strategy, trainer.is_global_zero
    problem = model_problem(model, "checkpoint.export=hf")
    if problem:
        raise TuneupError(problem)
    check_out(path)
    state = model.state_dict()
    tensors = {key: state[key].detach() for key in saved_keys(model)}
    plan = file_plan(
        {k: t.numel() * t.element_size() for k, t in tensors.items()}, at_least=trainer.world_size
    )
    temp = path.with_name(f".{path.name}{TEMP_MARK}{strategy.broadcast(str(os.getpid()))}")
    parts = temp / "sharded"  # each rank's part of each file, assembled below, then removed
    if first:
        shutil.rmtree(temp, ignore_errors=True)
        parts.mkdir(parents=True)
    strategy.barrier()
    distributed = dist.is_available() and dist.is_initialized()
    writer = HuggingFaceStorageWriter(str(parts), fqn_to_index_mapping=plan, save_distributed=True)
    with warnings.catch_warnings():  # one process (strategy=auto): DCP says it, as meant
        warnings.filterwarnings("ignore", "torch.distributed is disabled")
        save(tensors, storage_writer=writer, no_dist=not distributed)
    if distributed:  # each rank the files i with i % world_size == rank; rank 0 the index
        consolidate_safetensors_files_on_every_rank(str(parts), str(temp), plan)
    else:
        consolidate_safetensors_files(str(parts), str(temp), plan)
    if first:
        restore_scalars(temp, parts, [key for key, t in tensors.items() if t.dim() == 0])
        shutil.rmtree(parts)
        write_config(model, temp, floating_dtype(tensors.values()))
        fsync_directory(temp)
        replace(temp, path)
        fsync_directory(path.parent)
    strategy.barrier()
    return path


def restore_scalars(directory: Path, parts: Path, keys: list[str]) -> None:
    """Put 0-d tensors' values into the assembled files: DCP's consolidation (torch 2.13)
    leaves their bytes zero (its copy loop returns early on an empty shape)."""
    if not keys:
        return
    from safetensors import safe_open

    weight_map = json.loads((directory / INDEX).read_text())["weight_map"]
    for part in sorted(parts.glob("*.safetensors")):
        with safe_open(part, framework="pt") as f:
            for key in set(keys) & set(f.keys()):
                overwrite(directory / weight_map[key], key, f.get_tensor(key))


def overwrite(file: Path, key: str, value: torch.Tensor) -> None:
    """Overwrite ``key``'s bytes in the safetensors ``file`` (same shape and dtype)."""
    with open(file, "r+b") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        start = json.loads(f.read(size))[key]["data_offsets"][0]
        f.seek(8 + size + start)
        f.write(value.reshape(-1).view(torch.uint8).numpy().tobytes())


# -- tuneup-consolidate --format hf: one process, file by file -------------------------------


def write(
    out: Path,
    model,
    shapes: dict[str, torch.Tensor],
    read: Callable[[list[str]], dict[str, torch.Tensor]],
) -> int:
    """Write the directory ``out`` for ``model`` (its config; a meta model will do) from
    tensors ``read(names)`` returns, shaped as ``shapes`` (empty or meta tensors keyed by
    ``saved_keys(model)``), one output file at a time. Returns the number of values."""
    from safetensors.torch import save_file

    from tuneup.trainer.state.checkpoint_write import fsync_directory
    from tuneup.trainer.state.sharded import TEMP_MARK, replace

    check_out(out)
    plan = file_plan({k: t.numel() * t.element_size() for k, t in shapes.items()})
    count = max(plan.values(), default=1)
    temp = out.with_name(f".{out.name}{TEMP_MARK}{os.getpid()}")
    shutil.rmtree(temp, ignore_errors=True)
    temp.mkdir(parents=True)
    try:
        weight_map = {key: file_name(index, count) for key, index in plan.items()}
        for index in range(1, count + 1):
            names = [key for key, i in plan.items() if i == index]
            tensors = {key: t.contiguous() for key, t in read(names).items()}
            save_file(tensors, temp / file_name(index, count), metadata={"format": "pt"})
            del tensors
        total = sum(t.numel() * t.element_size() for t in shapes.values())
        index_json = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (temp / INDEX).write_text(json.dumps(index_json, indent=2) + "\n")
        write_config(model, temp, floating_dtype(shapes.values()))
        fsync_directory(temp)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    replace(temp, out)
    return sum(t.numel() for t in shapes.values())
