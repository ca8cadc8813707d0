"""Batches staged on the device one ahead of the loop (``prefetch_to_device``, asked for by the
``data_path`` plugin through the ``configure_dataloader`` kwargs; trainer/datamodule.py explains
the streams and why the staging sits below :class:`ResumableLoader`'s count)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

import torch
from torch.utils.data import DataLoader

from tuneup.trainer.state.data_order import ResumableLoader


class Staged:
    """A batch whose copy and device work were issued on a side stream (``event``: their end).

    Not a tensor or a collection, so Lightning's ``convert_input`` and batch hooks pass it
    through untouched until the data module's transfer hook calls :meth:`take`.
    """

    __slots__ = ("batch", "event")

    def __init__(self, batch, event=None) -> None:
        self.batch, self.event = batch, event

    def take(self):
        """The batch, usable on the current stream from here on."""
        if self.event is not None:
            stream = torch.cuda.current_stream()
            stream.wait_event(self.event)  # this batch only, not what was staged after it
            for tensor in _tensors(self.batch):
                tensor.record_stream(stream)  # allocated on the side stream, used on this one
        return self.batch


def _tensors(batch) -> Iterator[torch.Tensor]:
    if isinstance(batch, torch.Tensor):
        yield batch
    elif isinstance(batch, Mapping):
        for value in batch.values():
            yield from _tensors(value)
    elif isinstance(batch, (list, tuple)):
        for value in batch:
            yield from _tensors(value)


def one_ahead(batches, stage: Callable) -> Iterator:
    """``batches`` with each one staged before the previous one is handed out."""
    ahead = None
    for batch in batches:
        staged = stage(batch)
        if ahead is not None:
            yield ahead
        ahead = staged
    if ahead is not None:
        yield ahead


class PrefetchLoader(DataLoader):
    """A DataLoader whose batches are staged on the device one ahead, when ``stage`` is given."""

    def __init__(self, *args, stage: Callable | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.stage = stage

    def __iter__(self):
        batches = super().__iter__()
        return batches if self.stage is None else one_ahead(batches, self.stage)


class ResumablePrefetchLoader(ResumableLoader, PrefetchLoader):
    """The training loader: :class:`ResumableLoader` counts the batches that
    :class:`PrefetchLoader` (below it in the MRO) hands out, not those it staged ahead."""
