"""Lightning's CheckpointIO for tuneup: :func:`~.checkpoint_write.atomic_save` to write,
safe, verified :func:`~.checkpoint_read.load` to read, sharded directories reassembled."""

from __future__ import annotations

from pathlib import Path

from lightning_fabric.plugins.io.torch_io import TorchCheckpointIO

from tuneup import TuneupError
from tuneup.trainer.state import sharded
from tuneup.trainer.state.checkpoint_read import load, verify
from tuneup.trainer.state.checkpoint_write import atomic_save


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint reader/writer, with :func:`atomic_save` and safe :func:`load`."""

    def save_checkpoint(self, checkpoint, path, storage_options=None) -> None:
        if storage_options is not None:
            raise TypeError("AtomicCheckpointIO takes no storage_options")
        atomic_save(checkpoint, path)

    def load_checkpoint(self, path, map_location=None, weights_only=None) -> dict:
        if sharded.is_sharded(path):  # written by strategy=fsdp: reassembled in this process
            verify(Path(path))
            return sharded.full_checkpoint(Path(path))
        if not Path(path).is_file():
            raise TuneupError(f"checkpoint {path} does not exist")
        return load(path, map_location=map_location or "cpu")
