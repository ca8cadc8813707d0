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


def read(path: Path) -> dict:
    """The whole checkpoint at ``path``, full tensors on the CPU, verified."""
    from tuneup.trainer.state import sharded
    from tuneup.trainer.state.checkpoint_read import load

    if sharded.is_sharded(path):
        sharded.verify(path)
        return sharded.full_checkpoint(path)
    return load(path)


def consolidate(source: str | Path, out: str | Path) -> dict[str, torch.Tensor]:
    """Write ``source``'s model weights to ``out`` (atomically); returns them."""
    from tuneup import TuneupError
    from tuneup.trainer.state.checkpoint_write import atomic_save

    source, out = Path(source), Path(out)
    if not source.exists():
        raise TuneupError(f"{source}: no such checkpoint (a .ckpt file or directory)")
    if out.resolve() == source.resolve():
        raise TuneupError(f"OUT ({out}) must not be the checkpoint itself")
    state = model_state_dict(read(source))
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
    args = parser.parse_args(argv)
    try:
        state = consolidate(args.checkpoint, args.out)
    except TuneupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    count = sum(t.numel() for t in state.values())
    print(f"wrote {args.out}: {len(state)} tensors, {count:,} values")
    return 0


if __name__ == "__main__":
    sys.exit(main())
