"""What machine the run will use, worked out from the config before anything is built.

Plugins' ``check`` hooks receive an :class:`Environment` so they can say, for
example, "fp16 needs a GPU with tensor cores" before a process is spawned.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Environment:
    accelerator: str  # "cpu" or "cuda" (or "mps"): what Lightning will run on
    devices: int  # processes per node
    num_nodes: int
    device_name: str
    cuda_capability: tuple[int, int] | None  # e.g. (9, 0) on H100/H200; None off CUDA
    bf16_supported: bool

    @property
    def world_size(self) -> int:
        return self.devices * self.num_nodes

    @property
    def is_cuda(self) -> bool:
        return self.accelerator == "cuda"

    @classmethod
    def from_config(cls, cfg) -> Environment:
        accelerator = _accelerator(str(cfg.trainer.get("accelerator", "auto")))
        devices = _device_count(cfg.trainer.get("devices", 1), accelerator)
        cuda = accelerator == "cuda" and torch.cuda.is_available()
        capability = torch.cuda.get_device_capability() if cuda else None
        return cls(
            accelerator=accelerator,
            devices=devices,
            num_nodes=int(cfg.trainer.get("num_nodes", 1) or 1),
            device_name=_device_name(accelerator),
            cuda_capability=capability,
            bf16_supported=_bf16_supported(accelerator),
        )


def _accelerator(requested: str) -> str:
    if requested in ("gpu", "cuda"):
        return "cuda"
    if requested == "auto":
        if torch.cuda.is_available():
            return "cuda"
        return "cpu"
    return requested


def _device_count(devices, accelerator: str) -> int:
    if isinstance(devices, int) and not isinstance(devices, bool):
        if devices == -1:
            return torch.cuda.device_count() if accelerator == "cuda" else 1
        return devices
    if isinstance(devices, str) and devices != "auto":
        parts = [p for p in devices.split(",") if p.strip()]
        return len(parts) if len(parts) > 1 else int(parts[0]) if parts else 1
    if devices == "auto":
        return torch.cuda.device_count() if accelerator == "cuda" else 1
    return len(list(devices))  # a list of device indices


def _device_name(accelerator: str) -> str:
    if accelerator == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name()
    if accelerator == "cpu":
        import platform

        return (
            f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"
        )
    return accelerator


def _bf16_supported(accelerator: str) -> bool:
    if accelerator == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return accelerator == "cpu"  # CPU autocast supports bfloat16 everywhere torch runs
