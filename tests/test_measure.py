"""The measure plugin's CUDA arithmetic, with stand-in events (the real ones: tests/gpu)."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from tuneup.plugins.measure import Plugin


class Event:
    """A CUDA event reached by the GPU at ``t`` milliseconds."""

    def __init__(self, t: float) -> None:
        self.t = t

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, other: Event) -> float:
        return other.t - self.t


def test_on_cuda_data_wait_is_the_gpu_time_between_a_batch_end_and_the_next_start():
    """Two measured steps of 10 ms; the GPU sat between batches 1 ms, then 4 ms: 5 of 20.
    The host's blocked time (half of it here) is CUDA's queue filling up, not data: unused."""
    plugin = Plugin(OmegaConf.create({}))
    plugin.device = torch.device("cuda")
    plugin.pending = [(Event(0), Event(9), Event(10)), (Event(10), Event(16), Event(20))]
    plugin.wait_s, plugin.host_s = 5.0, 10.0
    plugin._drain(block=True)
    assert plugin.intervals_ms == [10, 10] and plugin.pending == []
    assert plugin._data_wait_fraction(sum(plugin.intervals_ms)) == pytest.approx(0.25)
    plugin.device = torch.device("cpu")  # CPU: the host's own time is the step's
    assert plugin._data_wait_fraction(20.0) == pytest.approx(0.5)
