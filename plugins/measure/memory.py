"""peak_memory_bytes and memory_available_bytes: what a run used and what it could have used.

The CUDA allocator's figures on a GPU; on CPU the process's peak resident set size (reset at
each fit) and, on Linux, /proc and the cgroup's limit. Also used by the strategy plugin
(plugins/strategy/) and autotune's batch search (tuneup/autotune/speed/batch.py).
"""

from __future__ import annotations

import resource
import sys
from pathlib import Path

import torch


def peak_memory(device) -> int:
    if device is not None and device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)  # Linux reports KiB


def memory_available(device) -> int | None:
    """See memory_available_bytes in the module docstring; None where it cannot be read."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    try:
        with open("/proc/meminfo") as f:
            info = {line.split(":")[0]: line.split()[1] for line in f}
        with open("/proc/self/statm") as f:
            resident_pages = int(f.read().split()[1])
    except (OSError, KeyError, IndexError, ValueError):  # not Linux
        return None
    free = int(info["MemAvailable"]) * 1024
    free = min(free, _cgroup_room() or free)
    return resident_pages * resource.getpagesize() + free


def _cgroup_room() -> int | None:
    """Bytes the process's cgroup (v2) may still allocate, when it has a memory limit."""
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text())
    except (OSError, ValueError):
        return None
    return None if limit == "max" else max(0, int(limit) - used)


def reset_peak_rss() -> None:
    """Linux: start the process's peak-RSS record (VmHWM, ru_maxrss) again from the current RSS."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:  # not Linux, or not allowed: the peak then covers the whole process
        pass
