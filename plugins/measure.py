"""Always-on measurement: samples/s, step-time percentiles, data wait, peak memory, loss, metrics.

Cheap by construction: no device synchronisation per step. On CPU a step's
time is read from ``perf_counter``; on CUDA a timing event is recorded at each
batch start (asynchronous) and the elapsed times are read only once the events
have completed, so the GPU queue is never drained for measurement.

Definitions (all over the steady state: the first ``measure.warmup_steps``
micro-batches and the first step after each validation are left out):

- step time: from one training micro-batch start to the next, i.e. it includes
  fetching the next batch; p50 and p90 in milliseconds.
- samples/s: samples in the measured steps (every data shard: the data-parallel ranks; the
  ranks of one tensor-parallel group share their samples) / their total time. ``samples``
  and the other sample counts below are counted the same way.
- data_wait_fraction: host time blocked between a batch's end and the next
  batch's start (the DataLoader and host-to-device copy) / measured host time.
- peak_memory_bytes: the CUDA caching allocator's peak on GPU; the process's
  peak resident set size on CPU.
- flops_per_sample, achieved_tflops, mfu: model FLOPs of one sample's forward and
  backward (counted once on the meta device, see trainer/flops.py) x samples/s,
  and that over the device's peak when the device is known.
- saved_activation_bytes: bytes autograd keeps for backward during the forward
  of one micro-batch (the 2nd), see :class:`SavedActivationBytes`. Reported with
  activation checkpointing on or off, so the two can be compared.
- samples_per_s_windows: the measured steps cut into ``measure.windows`` consecutive
  windows of (nearly) equal step count, samples/s of each: the run's spread, and what
  the sweep report and autotune compare (tuneup/autotune/interval.py). Computed at the
  report from the step times kept anyway: nothing per step.
- steps, epochs, samples, micro_batches: the whole run's, resumed sessions included;
  steps_this_session, samples_this_session, micro_batches_this_session: this process's
  session only (the same as the run's in a run that was not resumed). A checkpoint carries
  the run's totals (this plugin's state) so a resumed run can add its own.
- loss_curve: the mean training loss over buckets of consecutive micro-batches of this
  session, from its first micro-batch (``samples``: the run's samples seen at each bucket's
  end, all ranks, counted from the run's start), at most
  2 x ``measure.windows`` points, see :class:`LossCurve`. Summed on the loss's device and
  read once at the report, so no step waits for the GPU.
- device_hours, gpu_hours: the fit's wall time x processes (one device each), in hours;
  gpu_hours counts GPUs only, so a CPU run's is 0.0 and its device_hours are CPU
  process-hours.
- memory_available_bytes: the most memory this run could have used, read at the fit's
  start: the device's total memory on CUDA (against peak_memory_bytes, the allocator's
  peak); on CPU (Linux) the process's resident memory plus the system's MemAvailable, or
  the cgroup's remaining limit if lower (against the peak resident set size).
- gpu_power_w, gpu_energy_kwh: mean power of the run's GPU during the fit and the energy
  of all its GPUs (rank 0's x world size: every rank does the same work), from NVML
  (``pip install 'tuneup[power]'``), only on NVIDIA GPUs; see :class:`GpuPower`.
"""

from __future__ import annotations

import importlib.util
import math
import resource
import statistics
import sys
import threading
import time
from itertools import pairwise
from pathlib import Path

import torch

from tuneup import hookimpl
from tuneup.trainer import flops
from tuneup.trainer.state.data_order import data_shard
from tuneup.trainer.validation import BOOL, Integer, problems

#: The training micro-batch (0-based, counted over the run) whose forward is measured for
#: saved_activation_bytes: the 2nd, so the first step's one-time work is not in it.
SAVED_BYTES_MICRO_BATCH = 1
#: Default of ``measure.windows``: speed windows per run (and half the loss curve's points at most).
WINDOWS = 8


class SavedActivationBytes:
    """Counts the bytes autograd saves for backward while active (a saved-tensors pack hook).

    Every tensor an op saves for backward passes through the pack hook. Storages
    are counted once (keyed by data pointer: views and a tensor saved by two ops
    are one allocation), and the model's parameters and buffers are left out
    (they stay in memory anyway). Hooks nest innermost-wins, so inside a block
    under non-reentrant activation checkpointing the checkpoint's own hooks take
    over and what it drops is not counted, while the block inputs it keeps are
    saved outside them and are counted: the total is what is really kept.
    """

    def __init__(self, module) -> None:
        tensors = (*module.parameters(), *module.buffers())
        self.exclude = {key[0] for t in tensors if (key := storage_of(t)) is not None}
        self.storages: dict[int, int] = {}
        self.hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self.hooks.__enter__()

    def _pack(self, tensor):
        key = storage_of(tensor)
        if key is not None and key[0] not in self.exclude:
            self.storages[key[0]] = key[1]
        return tensor.detach()  # not the tensor itself: that would make a reference cycle

    def stop(self) -> int:
        self.hooks.__exit__(None, None, None)
        return sum(self.storages.values())


def storage_of(tensor) -> tuple[int, int] | None:
    """(data pointer, bytes) of the memory behind ``tensor``: a DTensor's local shard; None for
    a tensor without storage of its own (FSDP2's unsharded parameters between all-gathers)."""
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    try:
        storage = local.untyped_storage()
        return storage.data_ptr(), storage.nbytes()
    except (RuntimeError, NotImplementedError):
        return None


class LossCurve:
    """The mean training loss over buckets of consecutive micro-batches, kept on the loss's device.

    Each micro-batch's loss is added into its bucket on the device (one small kernel, no
    read-back). When ``points`` buckets are full, neighbours merge and every bucket holds
    twice as many micro-batches: a run of any length keeps between points/2 and points
    points. The sums are read once, in :meth:`values`.
    """

    def __init__(self, points: int) -> None:
        self.points = points + points % 2  # even, so buckets merge in pairs
        self.sums = None  # tensor [points] on the loss's device
        self.counts: list[int] = []  # micro-batches per bucket
        self.samples: list[int] = []  # samples per bucket (this process)
        self.per_bucket = 1

    def add(self, loss, samples: int) -> None:
        if self.sums is None:
            self.sums = torch.zeros(self.points, dtype=torch.float32, device=loss.device)
        if not self.counts or self.counts[-1] == self.per_bucket:
            if len(self.counts) == self.points:
                self._merge()  # every merged bucket is full: a new one follows
            self.counts.append(0)
            self.samples.append(0)
        self.sums[len(self.counts) - 1].add_(loss)  # in place on the device: no sync
        self.counts[-1] += 1
        self.samples[-1] += samples

    def _merge(self) -> None:
        half = self.points // 2
        self.sums = torch.cat([self.sums.view(half, 2).sum(1), self.sums.new_zeros(half)])
        self.counts = [a + b for a, b in zip(self.counts[::2], self.counts[1::2], strict=True)]
        self.samples = [a + b for a, b in zip(self.samples[::2], self.samples[1::2], strict=True)]
        self.per_bucket *= 2

    def values(self, world: int = 1, start: int = 0) -> dict | None:
        """``{"samples": [seen at each bucket's end], "loss": [bucket means]}``, or None;
        ``start``: samples seen before the first bucket (by earlier sessions of a resumed run)."""
        if self.sums is None:
            return None
        sums = self.sums[: len(self.counts)].tolist()  # the one read of the device
        seen, total = [], start
        for samples in self.samples:
            total += samples * world
            seen.append(total)
        losses = [_rounded(s / c) for s, c in zip(sums, self.counts, strict=True)]
        return {"samples": seen, "loss": losses}


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
        if device is None or device.type != "cuda" or importlib.util.find_spec("pynvml") is None:
            return None
        import pynvml

        try:
            pynvml.nvmlInit()
            uuid = torch.cuda.get_device_properties(device).uuid
            return cls(pynvml, pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}"))
        except (pynvml.NVMLError, AttributeError, RuntimeError):
            return None  # not an NVIDIA GPU, no driver access, or a torch without uuid

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


class Plugin:
    def __init__(self, cfg) -> None:
        settings = cfg.get("measure") or {}
        self.warmup_steps = settings.get("warmup_steps", 2)
        self.windows = settings.get("windows", WINDOWS)
        self.measured_sizes: list[int] = []  # samples behind each of intervals_ms, in order
        self.loss_curve = LossCurve(2 * self.windows)
        self.fit_started = self.fit_ended = None
        self.memory_available: int | None = None
        self.power: GpuPower | None = None
        self.intervals_ms: list[float] = []  # resolved step times
        self.pending: list = []  # CUDA: (start_event, next_start_event) pairs not yet read
        self.samples = self.micro_batches = 0  # this session's (this process's)
        #: The run's totals before this session (a resumed run's checkpoint); None: not known
        #: (a checkpoint of an older tuneup)
        self.before: dict[str, int | None] = {"samples": 0, "micro_batches": 0}
        self.start_step: int | None = None  # the optimizer step this session started from
        self.measured_samples = 0
        self.wait_s = self.host_s = 0.0
        self.last_start = self.last_end = self.last_event = None
        self.skip_next = True
        self.last_loss = None
        self.val: dict[str, float] = {}
        self.device = None
        self.flops_per_sample: float | None = None
        self.flops_note: str | None = None  # why flops_per_sample is None
        self.saved: SavedActivationBytes | None = None  # counting during one forward
        self.saved_bytes: int | None = None
        self.plan = None

    @hookimpl
    def check(self, cfg, plan):
        self.plan = plan  # what is trained, for its FLOPs once training starts
        return problems(cfg, {"measure.warmup_steps": Integer(low=0),
                              "measure.windows": Integer(low=1),
                              "measure.console_table": BOOL})  # fmt: skip

    @hookimpl
    def on_fit_start(self, cfg, trainer, module):
        self.device = module.device
        if self.plan is not None:
            self.flops_per_sample, self.flops_note = flops.count_flops(self.plan)
        self.world_size = trainer.world_size
        self.data_shards = data_shard(trainer)[1]  # samples: the world less tensor parallelism's
        self.fit_started = time.perf_counter()
        self.memory_available = memory_available(self.device)
        self.power = GpuPower.open(self.device)
        if self.power is not None:
            self.power.start()
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            _reset_peak_rss()  # several runs in one process (a sweep): each reports its own peak

    @hookimpl(tryfirst=True)
    def on_train_batch_start(self, trainer, batch, module):
        if self.start_step is None:
            self.start_step = trainer.global_step  # a resumed run's step is restored by now
        if self.micro_batches == SAVED_BYTES_MICRO_BATCH:
            self.saved = SavedActivationBytes(module)  # stopped before this batch's backward
        now = time.perf_counter()
        measured = not self.skip_next and self.micro_batches >= self.warmup_steps
        if measured:
            self.wait_s += now - self.last_end
            self.host_s += now - self.last_start
            self.measured_samples += self._batch_size
            self.measured_sizes.append(self._batch_size)
        if self.device.type == "cuda":
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            if measured:
                self.pending.append((self.last_event, event))
            self.last_event = event
            self._drain(block=False)
        elif measured:
            self.intervals_ms.append((now - self.last_start) * 1e3)
        self.last_start = now
        self.skip_next = False
        self._batch_size = _batch_size(batch)

    @hookimpl(trylast=True)  # the hook was pushed first (tryfirst), so it is popped last
    def on_before_backward(self):
        self._stop_counting()

    @hookimpl
    def on_exception(self):
        self._stop_counting()

    def _stop_counting(self) -> None:
        if self.saved is not None:
            self.saved_bytes, self.saved = self.saved.stop(), None

    @hookimpl(trylast=True)
    def on_train_batch_end(self, trainer, outputs):
        self._stop_counting()  # a step without backward (training_step returned None)
        self.last_end = time.perf_counter()
        self.micro_batches += 1
        self.samples += self._batch_size
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if loss is not None:  # Lightning hands over loss / k under accumulation: undo that
            self.last_loss = loss.detach() * trainer.accumulate_grad_batches
            self.loss_curve.add(self.last_loss, self._batch_size)

    @hookimpl
    def on_fit_end(self):
        self.fit_ended = time.perf_counter()
        if self.power is not None:
            self.power.stop()

    @hookimpl
    def on_validation_end(self, trainer):
        self.skip_next = True  # the next interval contains validation time
        self.val = validation_metrics(trainer.callback_metrics)

    def _drain(self, block: bool) -> None:
        done = 0
        for start, end in self.pending:
            if not block and not end.query():
                break
            if block:
                end.synchronize()
            self.intervals_ms.append(start.elapsed_time(end))
            done += 1
        del self.pending[:done]

    @hookimpl
    def report(self, cfg, summary):
        if self.device is not None and self.device.type == "cuda":
            self._drain(block=True)
        total_ms = sum(self.intervals_ms)
        world, shards = getattr(self, "world_size", 1), getattr(self, "data_shards", 1)
        summary.update(
            samples_per_s=self.measured_samples * shards / (total_ms / 1e3) if total_ms else None,
            step_time_ms=_percentiles(self.intervals_ms),
            data_wait_fraction=self.wait_s / self.host_s if self.host_s else None,
            peak_memory_bytes=peak_memory(self.device),
            saved_activation_bytes=self.saved_bytes,
            **self._totals(shards),
            steps_this_session=self._session_steps(summary.get("steps")),
            micro_batches_this_session=self.micro_batches,
            samples_this_session=self.samples * shards,
            train_loss=float(self.last_loss) if self.last_loss is not None else None,
            val=self.val,
        )
        speed, device = summary["samples_per_s"], summary.get("device", "")
        summary.update(
            flops.throughput(self.flops_per_sample, speed, device, world, self.flops_note)
        )
        summary.update(
            samples_per_s_windows=speed_windows(
                self.intervals_ms, self.measured_sizes, self.windows, shards
            ),
            loss_curve=self.loss_curve.values(shards, start=self.before["samples"] or 0),
            memory_available_bytes=self.memory_available,
            **self._device_time(world),
        )

    def _device_time(self, world: int) -> dict:
        """device_hours, gpu_hours and, where NVML reads them, GPU power and energy."""
        if self.fit_started is None:
            return {}
        seconds = (self.fit_ended or time.perf_counter()) - self.fit_started
        hours = seconds * world / 3600
        gpu = self.device is not None and self.device.type == "cuda"
        figures = {"device_hours": hours, "gpu_hours": hours if gpu else 0.0}
        if self.power is not None:
            figures.update(self.power.figures(world))
        return figures

    def _totals(self, shards: int) -> dict:
        """``samples`` and ``micro_batches`` of the whole run (None where a resumed run's
        checkpoint did not carry what came before)."""
        now = {"samples": self.samples * shards, "micro_batches": self.micro_batches}
        return {k: None if self.before[k] is None else self.before[k] + v for k, v in now.items()}

    def _session_steps(self, steps: int | None) -> int | None:
        return None if steps is None else steps - (self.start_step or 0)

    def state_dict(self) -> dict:
        """The run's totals so far, for the summary of a run resumed from this checkpoint."""
        return self._totals(getattr(self, "data_shards", 1))

    @hookimpl
    def on_load_checkpoint(self, checkpoint):
        state = (checkpoint.get("tuneup") or {}).get("measure")
        state = state if isinstance(state, dict) else {}
        self.before = {k: state.get(k) for k in ("samples", "micro_batches")}

    def describe(self):
        return {"warmup_steps": self.warmup_steps, "windows": self.windows}


def speed_windows(intervals_ms: list[float], sizes: list[int], count: int, world: int = 1):
    """samples/s of ``count`` consecutive windows of the measured steps (fewer if fewer steps)."""
    n = min(len(intervals_ms), len(sizes))
    if not n:
        return []
    k = min(count, n)
    bounds = [round(i * n / k) for i in range(k + 1)]
    return [
        _rounded(sum(sizes[a:b]) * world / (sum(intervals_ms[a:b]) / 1e3))
        for a, b in pairwise(bounds)
        if sum(intervals_ms[a:b]) > 0
    ]


def _rounded(value: float) -> float:
    """Six significant digits: the summary stays readable, nothing measured is lost."""
    return float(f"{value:.6g}") if math.isfinite(value) else value


def _batch_size(batch) -> int:
    """Samples in a batch: the length of its first tensor (a tuple, list or dict batch)."""
    from tuneup.trainer.batches import first_tensor

    first = first_tensor(batch)
    return len(first) if first is not None else 0


def validation_metrics(metrics: dict) -> dict[str, float]:
    """The logged validation metrics by short name: ``val/acc`` (tuneup's) or ``val_acc``,
    ``val_loss`` (a user's LightningModule) -> ``acc``, ``loss``."""
    found = {}
    for key, value in metrics.items():
        for prefix in ("val/", "val_"):
            if key.startswith(prefix) and getattr(value, "numel", lambda: 1)() == 1:
                found[key[len(prefix) :]] = float(value)
    return found


def _percentiles(values: list[float]) -> dict:
    if len(values) < 2:
        value = values[0] if values else None
        return {"p50": value, "p90": value, "count": len(values)}
    deciles = statistics.quantiles(values, n=10)
    return {"p50": statistics.median(values), "p90": deciles[8], "count": len(values)}


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


def _reset_peak_rss() -> None:
    """Linux: start the process's peak-RSS record (VmHWM, ru_maxrss) again from the current RSS."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:  # not Linux, or not allowed: the peak then covers the whole process
        pass
