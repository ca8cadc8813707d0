"""``tuneup-consolidate CHECKPOINT OUT.pt``: the model's own weights from any tuneup checkpoint.

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
"""

from __future__ import annotations

import argparse
import sys
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


def consolidate(source: str | Path, out: str | Path, ema: bool = False) -> dict[str, torch.Tensor]:
    """Write ``source``'s model weights (``ema``: their moving average) to ``out``
    (atomically); returns them."""
    from tuneup import TuneupError
    from tuneup.trainer.state.checkpoint_write import atomic_save

    source, out = Path(source), Path(out)
    if not source.exists():
        raise TuneupError(f"{source}: no such checkpoint (a .ckpt file or directory)")
    if out.resolve() == source.resolve():
        raise TuneupError(f"OUT ({out}) must not be the checkpoint itself")
    checkpoint = read(source)
    state = ema_state_dict(checkpoint) if ema else model_state_dict(checkpoint)
    atomic_save(state, out)
    return state


def main(argv: list[str] | None = None) -> int:
    from tuneup import TuneupError

    parser = argparse.ArgumentParser(
        prog="tuneup-consolidate",
        description="Write the model's own state dict (its parameter names, full tensors) from "
        "a tuneup checkpoint, single-file or sharded, for plain torch.load + load_state_dict.",
    )
    parser.add_argument("checkpoint", help="a .ckpt file or a sharded checkpoint directory")
    parser.add_argument("out", help="the file to write, e.g. model.pt")
    parser.add_argument("--ema", action="store_true",
                        help="the moving average of the weights (a run with ema=on)")  # fmt: skip
    args = parser.parse_args(argv)
    try:
        state = consolidate(args.checkpoint, args.out, ema=args.ema)
    except TuneupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    count = sum(t.numel() for t in state.values())
    print(f"wrote {args.out}: {len(state)} tensors, {count:,} values")
    return 0


if __name__ == "__main__":
    sys.exit(main())
