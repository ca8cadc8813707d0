"""gpu_power_w, gpu_energy_kwh: a GPU's energy during the fit, from NVML (``tuneup[power]``).

Apart from the plugin (plugins/measure/) because it talks to the driver (pynvml) and may run a
sampling thread; the plugin only opens, starts and stops it.
"""

from __future__ import annotations

import importlib.util
import statistics
import threading
import time

import torch


class GpuPower:
    """Energy and mean power of one GPU during the fit, from NVML, off the training thread.

    NVML's energy counter (Volta and newer) is read at fit start and fit end: two calls,
    nothing per step. Where the GPU has no counter, a daemon thread samples the power draw
    every ``period_s`` and the energy is their mean x the time.
    """

    def __init__(self, nvml, handle, period_s: float = 0.1) -> None:
        self.nvml, self.handle, self.period_s = nvml, handle, period_s
        self.started = self.seconds = None
        self.first_mj = self.energy_j = None
        self.watts: list[float] = []
        self.thread: threading.Thread | None = None
        self.done = threading.Event()

    @classmethod
    def open(cls, device) -> GpuPower | None:
        """For the CUDA ``device`` when nvidia-ml-py is installed and the GPU is NVIDIA's."""
        found = nvml_handle(device)
        return None if found is None else cls(*found)

    def start(self) -> None:
        self.started = time.perf_counter()
        try:
            self.first_mj = self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle)
        except self.nvml.NVMLError:  # no energy counter (before Volta): sample the power
            self.thread = threading.Thread(target=self._sample, daemon=True)
            self.thread.start()

    def _sample(self) -> None:
        while not self.done.wait(self.period_s):
            try:
                self.watts.append(self.nvml.nvmlDeviceGetPowerUsage(self.handle) / 1e3)
            except self.nvml.NVMLError:
                return

    def stop(self) -> None:
        if self.started is None or self.seconds is not None:
            return
        self.seconds = time.perf_counter() - self.started
        if self.first_mj is not None:
            last = self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle)
            self.energy_j = (last - self.first_mj) / 1e3
        else:
            self.done.set()
            self.thread.join()
            self.energy_j = statistics.fmean(self.watts) * self.seconds if self.watts else None

    def figures(self, world: int) -> dict:
        self.stop()
        if self.energy_j is None or not self.seconds:
            return {}
        return {
            "gpu_power_w": self.energy_j / self.seconds,
            "gpu_energy_kwh": self.energy_j * world / 3.6e6,
        }


def nvml_handle(device):
    """(pynvml, the NVML handle of the CUDA ``device``), or None: not CUDA, no nvidia-ml-py
    (``tuneup[power]``), not an NVIDIA GPU, no driver access, or a torch without uuid."""
    if device is None or device.type != "cuda" or importlib.util.find_spec("pynvml") is None:
        return None
    import pynvml

    try:
        pynvml.nvmlInit()
        uuid = torch.cuda.get_device_properties(device).uuid
        return pynvml, pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}")
    except (pynvml.NVMLError, AttributeError, RuntimeError):
        return None
