"""What machine the run will use, worked out from the config before anything is built.

Plugins' ``check`` hooks receive an :class:`Environment` so they can say, for
example, "fp16 needs a GPU with tensor cores" before a process is spawned.
"""

from __future__ import annotations

import multiprocessing
import os
from dataclasses import dataclass

import torch
from omegaconf import OmegaConf


@dataclass(frozen=True)
class Environment:
    accelerator: str  # "cpu" or "cuda" (or "mps"): what Lightning will run on
    devices: int  # processes per node
    num_nodes: int
    device_name: str
    cuda_capability: tuple[int, int] | None  # e.g. (9, 0) on H100/H200; None off CUDA
    bf16_supported: bool  # autocast can compute in bfloat16 here
    bf16_native: str | None = None  # the hardware that makes bfloat16 fast here, None: none

    @property
    def world_size(self) -> int:
        return self.devices * self.num_nodes

    @property
    def is_cuda(self) -> bool:
        return self.accelerator == "cuda"

    @classmethod
    def from_config(cls, cfg) -> Environment:
        accelerator = _accelerator(str(cfg.trainer.get("accelerator", "auto")))
        distributed = OmegaConf.select(cfg, "strategy.name") in DISTRIBUTED
        devices = _device_count(cfg.trainer.get("devices", 1), accelerator, distributed)
        cuda = accelerator == "cuda" and torch.cuda.is_available()
        capability = torch.cuda.get_device_capability() if cuda else None
        return cls(
            accelerator=accelerator,
            devices=devices,
            num_nodes=int(cfg.trainer.get("num_nodes", 1) or 1),
            device_name=_device_name(accelerator),
            cuda_capability=capability,
            bf16_supported=_bf16_supported(accelerator),
            bf16_native=_bf16_native(accelerator, capability),
        )


def threads_as_asked() -> None:
    """torch's CPU threads as ``OMP_NUM_THREADS`` says, where the process was started with it
    but something lowered them at run time: joblib's loky workers (``hydra/launcher=joblib``)
    run at one thread per core // ``n_jobs`` whatever the variable says, though joblib passes
    the variable on when the shell set it. A run in such a worker gets what the variable asks."""
    asked = os.environ.get("OMP_NUM_THREADS", "")
    if asked.isdigit() and int(asked) > 0 and torch.get_num_threads() != int(asked):
        torch.set_num_threads(int(asked))


def standard_start_method() -> None:
    """The standard library's process start method as this process's default, where a
    launcher replaced it: joblib's loky workers (``hydra/launcher=joblib``) make ``loky`` the
    default, and a DataLoader's worker processes (``num_workers > 0``) cannot be started as
    loky's (``AttributeError: 'Process' object has no attribute 'env'``). A run in such a
    worker then starts its DataLoader workers as a run in its own process does."""
    standard = multiprocessing.get_all_start_methods()  # the platform's default first
    if multiprocessing.get_start_method(allow_none=True) not in (None, *standard):
        multiprocessing.set_start_method(standard[0], force=True)


def cpus_per_process(processes: int) -> int:
    """This node's CPUs shared among ``processes`` training processes, at least one each."""
    return max(1, usable_cpus() // max(1, processes))


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask, as Slurm sets it), else the machine's."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _accelerator(requested: str) -> str:
    if requested in ("gpu", "cuda"):
        return "cuda"
    if requested == "auto":
        if torch.cuda.is_available():
            return "cuda"
        return "cpu"
    return requested


#: Strategies that spread a run over processes: with them ``trainer.devices=auto`` is every GPU.
DISTRIBUTED = ("ddp", "fsdp")


def _device_count(devices, accelerator: str, distributed: bool = False) -> int:
    """Processes per node. ``auto`` (the default): every GPU of the node with strategy=ddp|fsdp,
    else one process (Lightning's own ``auto`` would take every GPU for any strategy)."""
    if isinstance(devices, int) and not isinstance(devices, bool):
        if devices == -1:
            return torch.cuda.device_count() if accelerator == "cuda" else 1
        return devices
    if isinstance(devices, str) and devices != "auto":
        parts = [p for p in devices.split(",") if p.strip()]
        return len(parts) if len(parts) > 1 else int(parts[0]) if parts else 1
    if devices == "auto":
        gpus = torch.cuda.device_count() if accelerator == "cuda" else 0
        return max(1, gpus) if distributed else 1
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


#: CPU feature flags (Linux /proc/cpuinfo) of bfloat16 arithmetic in hardware: Intel/AMD
#: AVX512-BF16 and AMX, Arm's BF16 extension. Without them CPU bfloat16 is emulated, and
#: bf16 autocast runs many times slower than fp32.
BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16", "bf16")


def _bf16_native(accelerator: str, capability: tuple[int, int] | None) -> str | None:
    if accelerator == "cuda":
        return "bfloat16 tensor cores" if capability and capability >= (8, 0) else None
    if accelerator != "cpu":
        return None
    flags = cpu_flags()
    return next((flag for flag in BF16_CPU_FLAGS if flag in flags), None)


def cpu_flags() -> set[str]:
    """The CPU's feature flags (x86 ``flags``, Arm ``Features``); empty where unknown."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return set(value.split())
    except OSError:
        pass
    return set()
