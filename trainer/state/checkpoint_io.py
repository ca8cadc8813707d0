"""Lightning's CheckpointIO for tuneup: :func:`~.checkpoint_write.atomic_save` to write (in the
background with a :class:`~.async_save.BackgroundWriter`), safe, verified
:func:`~.checkpoint_read.load` to read, sharded directories reassembled."""

from __future__ import annotations

from pathlib import Path

from lightning_fabric.plugins.io.torch_io import TorchCheckpointIO

from tuneup.errors import TuneupError
from tuneup.trainer.state import sharded
from tuneup.trainer.state.async_save import BackgroundWriter
from tuneup.trainer.state.checkpoint_read import load, verify
from tuneup.trainer.state.checkpoint_write import atomic_save
from tuneup.trainer.state.checkpoints import remember_written


def save_and_remember(checkpoint: dict, path) -> None:
    """:func:`atomic_save`, then its progress noted for the pruning that follows the save
    (:func:`.checkpoints.remember_written`): the file is not read back to learn it."""
    atomic_save(checkpoint, path)
    remember_written(path, checkpoint)


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint reader/writer, with :func:`atomic_save` and safe :func:`load`;
    ``writer``: saves go to the background (``checkpoint.async=true``; a sharded save finds
    it here too: :func:`.sharded.save`)."""

    def __init__(self, writer: BackgroundWriter | None = None) -> None:
        super().__init__()
        self.writer = writer

    def save_checkpoint(self, checkpoint, path, storage_options=None) -> None:
        if storage_options is not None:
            raise TypeError("AtomicCheckpointIO takes no storage_options")
        if self.writer is None:
            save_and_remember(checkpoint, path)
        else:  # copied now, before the next step changes the tensors; written meanwhile
            self.writer.submit(save_and_remember, self.writer.snapshot(checkpoint), path)

    def teardown(self) -> None:
        """The end of fit (also after an exception, once the callbacks waited and said why):
        no write left behind; its error, if it failed, was raised where training waited."""
        if self.writer is not None:
            self.writer.close()

    def load_checkpoint(self, path, map_location=None, weights_only=None) -> dict:
        if sharded.is_sharded(path):  # written by strategy=fsdp: reassembled in this process
            verify(Path(path))
            return sharded.full_checkpoint(Path(path))
        if not Path(path).is_file():
            raise TuneupError(f"checkpoint {path} does not exist")
        return load(path, map_location=map_location or "cpu")
