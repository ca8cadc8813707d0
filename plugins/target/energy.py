"""The energy the run's GPU used, from NVML's total energy counter (Volta and newer).

Two reads a session (its start, and each time the figure is asked for: a checkpoint, the
crossing), nothing per step. None where there is no counter to read: a CPU run, a GPU
that is not NVIDIA's or predates the counter, or no ``nvidia-ml-py`` (``tuneup[power]``).
"""

from __future__ import annotations

import importlib.util

import torch


class EnergyCounter:
    def __init__(self, nvml, handle) -> None:
        self.nvml, self.handle = nvml, handle
        self.first_mj = self._read()

    @classmethod
    def open(cls, device) -> EnergyCounter | None:
        if device is None or device.type != "cuda" or importlib.util.find_spec("pynvml") is None:
            return None
        import pynvml

        try:
            pynvml.nvmlInit()
            uuid = torch.cuda.get_device_properties(device).uuid
            return cls(pynvml, pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}"))
        except (pynvml.NVMLError, AttributeError, RuntimeError):
            return None  # not an NVIDIA GPU, no energy counter, no driver access

    def _read(self) -> int:
        return self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle)  # millijoules

    def joules(self) -> float:
        """Energy since this counter was opened."""
        return (self._read() - self.first_mj) / 1e3
