"""The energy the run's GPU used, from NVML's total energy counter (Volta and newer).

Two reads a session (its start, and each time the figure is asked for: a checkpoint, the
crossing), nothing per step. None where there is no counter to read: a CPU run, a GPU
that is not NVIDIA's or predates the counter, or no ``nvidia-ml-py`` (``tuneup[power]``).
"""

from __future__ import annotations

from tuneup.plugins.measure.power import nvml_handle


class EnergyCounter:
    def __init__(self, nvml, handle) -> None:
        self.nvml, self.handle = nvml, handle
        self.first_mj = self._read()

    @classmethod
    def open(cls, device) -> EnergyCounter | None:
        found = nvml_handle(device)
        if found is None:
            return None
        try:
            return cls(*found)
        except found[0].NVMLError:
            return None  # a GPU without the energy counter

    def _read(self) -> int:
        return self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle)  # millijoules

    def joules(self) -> float:
        """Energy since this counter was opened."""
        return (self._read() - self.first_mj) / 1e3
