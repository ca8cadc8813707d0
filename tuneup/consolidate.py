"""``tuneup-consolidate CHECKPOINT OUT.pt``: the model's own weights from any tuneup checkpoint;
``--format hf CHECKPOINT OUT_DIR``: a Hugging Face directory of them.

CHECKPOINT is a single file (``strategy=auto|ddp``) or a sharded directory
(``strategy=fsdp``, any number of processes, any tensor-parallel size: DCP reassembles the
full tensors in this one process, no process group needed). OUT.pt holds the model's
``state_dict`` with its own parameter names (those of your ``nn.Module``, without the
``model.`` prefix of tuneup's training module) and full tensors, so that::

    model = Net(...)
    model.load_state_dict(torch.load("OUT.pt"))

works without tuneup. The checkpoint is verified (checksums) first; OUT.pt is written
atomically. A run of ``model=lightning`` keeps its LightningModule's own names.

``--ema``: the moving average of the weights of a run with ``ema=on`` (plugins/ema.py)
instead of the trained weights, under the same names (integer buffers such as BatchNorm's
``num_batches_tracked`` are the trained ones: they are not averaged).

``--format hf``: OUT_DIR as ``save_pretrained`` writes it, for ``from_pretrained(OUT_DIR)``
(config.json, safetensors files, their index: trainer/state/hf_export.py), for a run whose model
is a transformers ``PreTrainedModel``. Its config comes from the model built on the meta device
from the run's record (``<run dir>/.hydra/config.yaml``), so the checkpoint stays in its run
directory. Written file by file: a sharded checkpoint's tensors are read only for the file
being written (at most ``hf_export.MAX_FILE_BYTES`` of them at once), never the whole model.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from pathlib import Path

import torch

#: tuneup's TrainingModule holds the user's model as ``self.model``.
PREFIX = "model."


def model_state_dict(checkpoint: dict) -> dict[str, torch.Tensor]:
    """The model's own ``state_dict`` from a Lightning checkpoint's (the prefix dropped when
    every key carries it: tuneup's training module)."""
    state = checkpoint["state_dict"]
    if state and all(key.startswith(PREFIX) for key in state):
        state = {key.removeprefix(PREFIX): value for key, value in state.items()}
    return {key: value.contiguous() for key, value in state.items()}


def ema_state_dict(checkpoint: dict) -> dict[str, torch.Tensor]:
    """The model's state_dict with the EMA weights (plugins/ema.py's state) in place of the
    trained ones."""
    from tuneup import TuneupError

    ema = ((checkpoint.get("tuneup") or {}).get("ema") or {}).get("model_shaped")
    if not isinstance(ema, dict):
        raise TuneupError(
            "--ema: this checkpoint has no moving average of the weights (its run had ema=off); "
            "leave out --ema for the trained weights"
        )
    return model_state_dict({"state_dict": {**checkpoint["state_dict"], **ema}})


def read(path: Path) -> dict:
    """The whole checkpoint at ``path``, full tensors on the CPU, verified."""
    from tuneup.trainer.state import sharded
    from tuneup.trainer.state.checkpoint_read import load

    if sharded.is_sharded(path):
        sharded.verify(path)
        return sharded.full_checkpoint(path)
    return load(path)


def paths(source: str | Path, out: str | Path) -> tuple[Path, Path]:
    from tuneup import TuneupError

    source, out = Path(source), Path(out)
    if not source.exists():
        raise TuneupError(f"{source}: no such checkpoint (a .ckpt file or directory)")
    if out.resolve() == source.resolve():
        raise TuneupError(f"OUT ({out}) must not be the checkpoint itself")
    return source, out


def consolidate(source: str | Path, out: str | Path, ema: bool = False) -> dict[str, torch.Tensor]:
    """Write ``source``'s model weights (``ema``: their moving average) to ``out``
    (atomically); returns them."""
    from tuneup.trainer.state.checkpoint_write import atomic_save

    source, out = paths(source, out)
    checkpoint = read(source)
    state = ema_state_dict(checkpoint) if ema else model_state_dict(checkpoint)
    atomic_save(state, out)
    return state


def own_names(keys) -> dict[str, str]:
    """The model's own name of each stored key (the prefix dropped as by model_state_dict)."""
    keys = list(keys)
    strip = bool(keys) and all(key.startswith(PREFIX) for key in keys)
    return {(key.removeprefix(PREFIX) if strip else key): key for key in keys}


def stored(source: Path):
    """(the checkpoint's tensors keyed by the model's own names, without their values for a
    sharded checkpoint: meta tensors of the saved shapes and dtypes; ``read(names)``: those
    tensors' values). A sharded checkpoint's are read by DCP, only the ones asked for."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint import load as dcp_load
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from tuneup.trainer.state import sharded
    from tuneup.trainer.state.checkpoint_read import load

    if not sharded.is_sharded(source):
        state = load(source, mmap=True)["state_dict"]  # memory-mapped: read when written
        names = own_names(state)
        return {n: state[k] for n, k in names.items()}, lambda wanted: {
            n: state[names[n]] for n in wanted
        }
    sharded.verify(source)
    index = FileSystemReader(str(source)).read_metadata().state_dict_metadata
    prefix = sharded.STATE_PREFIX
    shapes = {
        key.removeprefix(prefix): torch.empty(item.size, dtype=item.properties.dtype, device="meta")
        for key, item in index.items()
        if key.startswith(prefix) and isinstance(item, TensorStorageMetadata)
    }
    names = own_names(shapes)

    def read(wanted: list[str]) -> dict[str, torch.Tensor]:
        state = {
            prefix + names[n]: torch.empty_like(shapes[names[n]], device="cpu") for n in wanted
        }
        with warnings.catch_warnings():  # that it reads in one process: as meant
            warnings.filterwarnings("ignore", "torch.distributed is disabled")
            dcp_load(state, storage_reader=FileSystemReader(str(source)), no_dist=True)
        return {n: state[prefix + names[n]] for n in wanted}

    return {n: shapes[k] for n, k in names.items()}, read


def consolidate_hf(source: str | Path, out: str | Path) -> int:
    """Write ``source``'s model as the Hugging Face directory ``out`` (atomically); returns
    the number of values written."""
    from tuneup import TuneupError
    from tuneup.trainer.state import hf_export

    source, out = paths(source, out)
    model = run_model(source)
    problem = hf_export.model_problem(model, "--format hf")
    if problem:
        raise TuneupError(problem)
    tensors, read = stored(source)
    keys = hf_export.saved_keys(model)
    missing = [key for key in keys if key not in tensors]
    if missing:
        raise TuneupError(
            f"--format hf: {source} lacks {', '.join(missing[:3])} of the run's "
            "model (built from its record): not this run's checkpoint?"
        )
    return hf_export.write(out, model, {key: tensors[key] for key in keys}, read)


def run_model(checkpoint: Path):
    """The model of the run that wrote ``checkpoint``, built on the meta device from the run's
    record (``<run dir>/.hydra/config.yaml``, beside its ``checkpoints/``)."""
    from omegaconf import OmegaConf

    from tuneup import TuneupError
    from tuneup.trainer.components import Plan
    from tuneup.trainer.state.run_dir import RECORD_DIR

    records = [p / RECORD_DIR / "config.yaml" for p in list(checkpoint.resolve().parents)[:3]]
    record = next((r for r in records if r.is_file()), None)
    if record is None:
        raise TuneupError(
            f"--format hf: no {RECORD_DIR}/config.yaml of the run beside "
            f"{checkpoint} (its run directory's record): the model is built "
            "from it for config.json; keep the checkpoint in its run directory"
        )
    try:
        with torch.device("meta"):
            return Plan(OmegaConf.load(record)).build_model()
    except Exception as exc:
        cause = exc.__cause__ or exc
        raise TuneupError(
            f"--format hf: the run's model ({record}) could not be built: "
            f"{type(cause).__name__}: {cause}"
        ) from exc


def main(argv: list[str] | None = None) -> int:
    from tuneup import TuneupError

    parser = argparse.ArgumentParser(
        prog="tuneup-consolidate",
        description="Write the model's own state dict (its parameter names, full tensors) from "
        "a tuneup checkpoint, single-file or sharded, for plain torch.load + load_state_dict.",
    )
    parser.add_argument("checkpoint", help="a .ckpt file or a sharded checkpoint directory")
    parser.add_argument("out", help="the file to write, e.g. model.pt (--format hf: a directory)")
    parser.add_argument(
        "--ema", action="store_true", help="the moving average of the weights (a run with ema=on)"
    )
    parser.add_argument(
        "--format",
        choices=("torch", "hf"),
        default="torch",
        help="torch: one state dict file (default); hf: a Hugging Face "
        "directory for from_pretrained (a transformers model's run)",
    )
    args = parser.parse_args(argv)
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # the user's model and data code, as `tuneup` sees it
    if args.ema and args.format == "hf":
        parser.error("--ema writes --format torch only")
    try:
        if args.format == "hf":
            count = consolidate_hf(args.checkpoint, args.out)
            print(f"wrote {args.out}: a Hugging Face directory, {count:,} values")
            return 0
        state = consolidate(args.checkpoint, args.out, ema=args.ema)
    except TuneupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    count = sum(t.numel() for t in state.values())
    print(f"wrote {args.out}: {len(state)} tensors, {count:,} values")
    return 0


if __name__ == "__main__":
    sys.exit(main())
