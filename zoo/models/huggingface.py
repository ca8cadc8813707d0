"""``model=huggingface model.path=DIR``: a pretrained ``transformers`` model, trained by tuneup.

``DIR`` is what ``save_pretrained`` wrote (``config.json`` and ``*.safetensors``), or the name
of a Hugging Face hub model already in the local cache (nothing is downloaded). The model is
``model.auto_class`` (``AutoModelForCausalLM``) of that config, in ``model.dtype``.

- One process, or DDP: ``from_pretrained(DIR)``, transformers' own loading.
- On the meta device (the run's checks; ``strategy=fsdp``, which builds the model there,
  shards it and materialises each process's shard): ``from_config``, no weights. Under
  ``strategy=fsdp`` :func:`load_shards` then reads into each process's shards the slices it
  holds and nothing else: DCP's ``HuggingFaceStorageReader`` asks safetensors for each
  shard's slice (``get_slice``), so no process reads or holds a whole checkpoint.
- :func:`problems`: before any process starts, the directory, its files, and the
  checkpoint's names and shapes (read from the safetensors headers, not the tensors) against
  the model built from its config on the meta device, each a one-line error.

Names: the checkpoint's are the model's state-dict names, or those of its base model (a
checkpoint saved from ``GPT2Model`` has ``h.0...``, ``GPT2LMHeadModel`` calls it
``transformer.h.0...``), as ``from_pretrained`` accepts them. A tied output layer
(``lm_head.weight`` of GPT-2) is not in the checkpoint; it is the embedding. Keys transformers
ignores when loading (``_keys_to_ignore_on_load_unexpected``: GPT-2's old ``attn.bias``
masks, rotary ``inv_freq``) are skipped; any other key the model lacks, or a model key the
checkpoint lacks, is an error.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import torch
from torch import nn

from tuneup.errors import TuneupError
from tuneup.trainer.validation import OneOf, problem

DTYPES = ("float32", "bfloat16", "float16")
RULES = {"model.dtype": OneOf(DTYPES)}
#: What model.path must name, for the messages.
EXPECTED = (
    "a directory written by save_pretrained (config.json and *.safetensors), or the "
    "name of a Hugging Face hub model already in the local cache (nothing is downloaded)"
)
#: Checkpoint keys transformers skips for every model (modeling_utils: rotary buffers and
#: position ids that older checkpoints stored).
IGNORED = (r"rotary_emb\.inv_freq", r"(^|\.)position_ids$")


def build(settings, input_shape=None, num_classes=None) -> nn.Module:
    """The model of ``settings`` (``cfg.model``): its weights from the checkpoint, or built from
    its config alone where its parameters are empty (on the meta device: the checks, and
    ``strategy=fsdp``, whose shards :func:`load_shards` fills). ``input_shape`` and
    ``num_classes``, the zoo's builder arguments, are unused: the config says the vocabulary."""
    from tuneup.trainer.empty_init import building_empty

    directory = resolve(settings.path)
    auto, dtype = auto_class(settings.auto_class), getattr(torch, settings.dtype)
    if building_empty() or torch.get_default_device().type == "meta":
        from transformers import AutoConfig

        return auto.from_config(AutoConfig.from_pretrained(directory), dtype=dtype)
    # in training mode, as from_config builds it (from_pretrained's is in eval mode: Lightning
    # keeps a module's mode, so its dropout would be off for the whole training)
    return auto.from_pretrained(directory, dtype=dtype).train()


def resolve(path) -> Path:
    """The directory ``model.path`` names: itself, or a cached hub model's snapshot."""
    if Path(str(path)).expanduser().is_dir():
        return Path(str(path)).expanduser()
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(str(path), local_files_only=True))
    except Exception as exc:  # not a repo name, or not in the cache
        raise TuneupError(
            f"model.path={str(path)!r} is neither a directory nor a hub model in "
            f"the local cache: expected {EXPECTED}"
        ) from exc


def auto_class(name: str):
    """transformers' ``Auto*`` class called ``name`` (TuneupError naming a few if none)."""
    import transformers

    found = getattr(transformers, str(name), None) if str(name).startswith("AutoModel") else None
    if found is None or not hasattr(found, "from_config"):
        raise TuneupError(
            problem(
                "model.auto_class",
                name,
                "a transformers AutoModel class, e.g. AutoModelForCausalLM, "
                "AutoModelForSequenceClassification, AutoModelForMaskedLM",
            )
        )
    return found


# -- the checks, before any process starts: files, names and shapes ---------------------------


def problems(cfg) -> list[str]:
    """What keeps ``model=huggingface`` from loading ``model.path``, each in one line."""
    from omegaconf import OmegaConf

    node = cfg.model
    if OmegaConf.is_missing(node, "path"):
        return [
            f"model.path is not set: model=huggingface needs {EXPECTED}, e.g. "
            "model.path=/models/my-llama"
        ]
    try:
        directory = resolve(node.path)
        auto_class(node.auto_class)
    except TuneupError as exc:
        return [str(exc)]
    if not (directory / "config.json").is_file():
        return [f"model.path={str(node.path)!r} has no config.json: expected {EXPECTED}"]
    if not safetensors_files(directory):
        return [
            f"model.path={str(node.path)!r} has no *.safetensors file: expected {EXPECTED} "
            "(.bin checkpoints are not read: save the model again with save_pretrained, "
            "whose default is safetensors)"
        ]
    try:
        with torch.device("meta"):
            model = build(node)
    except Exception as exc:  # transformers' own words: an unknown architecture, a bad config
        return [
            f"model.path={str(node.path)!r}: {node.auto_class} cannot build the model of its "
            f"config.json: {type(exc).__name__}: {str(exc).splitlines()[0]}"
        ]
    found = mismatch(model, stored_shapes(directory))
    return (
        [
            f"model.path={str(node.path)!r} does not fit {type(model).__name__} "
            f"({node.auto_class} of its config.json): {found}"
        ]
        if found
        else []
    )


def safetensors_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.safetensors"))


def stored_shapes(directory: Path) -> dict[str, tuple[int, ...]]:
    """Each tensor's name and shape in the directory's safetensors files: headers only."""
    from safetensors import safe_open

    shapes = {}
    for file in safetensors_files(directory):
        with safe_open(str(file), framework="pt") as f:
            shapes.update({key: tuple(f.get_slice(key).get_shape()) for key in f.keys()})  # noqa: SIM118 (not iterable)
    return shapes


def checkpoint_names(model: nn.Module, stored) -> tuple[dict[str, str], list[str], list[str]]:
    """(model name -> checkpoint name, model names not stored, stored names not used). Tied
    parameters (``all_tied_weights_keys``: target -> source) are loaded through their source."""
    tied = set(getattr(model, "all_tied_weights_keys", None) or {})
    prefix = getattr(model, "base_model_prefix", "") or ""
    names, missing = {}, []
    for key in model.state_dict():
        if key in tied:
            continue
        candidates = (key, key.removeprefix(f"{prefix}."), f"{prefix}.{key}") if prefix else (key,)
        name = next((c for c in candidates if c in stored), None)
        if name is None:
            missing.append(key)
        else:
            names[key] = name
    ignored = [*IGNORED, *(getattr(model, "_keys_to_ignore_on_load_unexpected", None) or ())]
    used = set(names.values()) | tied
    unexpected = [n for n in stored if n not in used and not any(re.search(p, n) for p in ignored)]
    return names, missing, unexpected


def mismatch(model: nn.Module, stored: dict[str, tuple[int, ...]], shown: int = 3) -> str:
    """What does not fit between the model and the checkpoint, first keys first ("" if all
    does): names the model has and the checkpoint lacks, the reverse, then shapes."""
    names, missing, unexpected = checkpoint_names(model, stored)
    state = model.state_dict()
    shapes = [
        f"{key} {list(stored[name])} in the checkpoint, {list(state[key].shape)} in the model"
        for key, name in names.items()
        if tuple(stored[name]) != tuple(state[key].shape)
    ]
    parts = []
    for what, items in (
        ("not in the checkpoint", missing),
        ("not in the model", unexpected),
        ("shapes differ", shapes),
    ):
        if items:
            more = f" and {len(items) - shown} more" if len(items) > shown else ""
            parts.append(f"{what}: {', '.join(items[:shown])}{more}")
    return "; ".join(parts)


# -- strategy=fsdp: each process reads the slices it holds ------------------------------------


def loader(settings):
    """What fills ``model=huggingface``'s empty shards (the strategy's ``Settings.weights``)."""
    return functools.partial(load_shards, path=str(settings.path))


def load_shards(model: nn.Module, path) -> None:
    """Read the checkpoint at ``path`` into ``model`` where its parameters are: whole tensors,
    or each process's shards (DTensors, after FSDP2 / tensor parallelism), which get only
    their slices from the files (DCP's ``HuggingFaceStorageReader``). Non-persistent buffers
    (rotary frequencies), which no checkpoint holds, are computed by the model's own
    ``_init_weights``; everything else stays as loaded."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageReader
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        set_model_state_dict,
    )

    directory = resolve(path)
    stored = stored_shapes(directory)
    if found := mismatch(model, stored):
        raise TuneupError(f"model.path={str(path)!r} does not fit {type(model).__name__}: {found}")
    names, _, _ = checkpoint_names(model, stored)
    state = get_model_state_dict(model)
    wanted = {name: state[key] for key, name in names.items()}
    dcp.load(wanted, storage_reader=HuggingFaceStorageReader(str(directory)))
    set_model_state_dict(
        model,
        {key: wanted[name] for key, name in names.items()},
        options=StateDictOptions(strict=False),
    )
    compute_buffers(model)


@torch.no_grad()
def compute_buffers(model: nn.Module) -> None:
    """The non-persistent buffers of a transformers model (rotary ``inv_freq``), by its own
    ``_init_weights`` on the modules that hold them; their parameters, loaded, are marked
    initialised, which transformers' init functions respect."""
    init = getattr(model, "_init_weights", None)
    if init is None:
        return
    for module in model.modules():
        if not getattr(module, "_non_persistent_buffers_set", None):
            continue
        for param in module.parameters(recurse=False):
            param._is_hf_initialized = True
        init(module)
