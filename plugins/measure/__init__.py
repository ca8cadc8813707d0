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
- data_wait_fraction: the share of the step time spent between a batch's end and the next
  batch's start (the DataLoader, the host-to-device copy, the loop's own work). On CPU host
  time (perf_counter). On CUDA GPU time, from a second event recorded at each batch's end:
  the gap between it and the next start event is the time the GPU ran nothing of training's,
  waiting for the host to hand it the next batch. Host time on CUDA says nothing of the data:
  the host runs ahead of the GPU and blocks wherever the queue fills, which was in the data
  fetch (H200, ResNet-50: 0.50 with the data already on the GPU, 0.84 in fp32).
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
  the sweep report and autotune compare (tuneup/stats/interval.py). Computed at the
  report from the step times kept anyway: nothing per step.
- steps, epochs, samples, micro_batches: the whole run's, resumed sessions included;
  steps_this_session, samples_this_session, micro_batches_this_session: this process's
  session only (the same as the run's in a run that was not resumed). A checkpoint carries
  the run's totals (this plugin's state) so a resumed run can add its own.
- train_loss: the last optimizer step's loss (the mean over its micro-batches), and loss_curve: the mean training loss over
  buckets of consecutive micro-batches of this session, from its first micro-batch (``samples``: the run's samples seen at each bucket's
  end, all ranks, counted from the run's start), at most
  2 x ``measure.windows`` points, see :class:`LossCurve`. Summed on the loss's device and
  read once at the report, so no step waits for the GPU. Both are means over the
  data-parallel processes (the global batch's loss, as ``train/loss`` in metrics.csv at its
  logging steps, trainer/module.py): one all-reduce at the fit's end.
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

Modules: this package's ``__init__`` holds the plugin (the hooks that time the steps and
count the samples, and the report); ``figures`` the summary figures made from what it recorded
(speed windows, percentiles); ``train_loss`` the training loss (the last step's and the
curve's, ``loss_curve``); ``saved_bytes`` the saved-activation count; ``memory`` peak and
available memory; ``power`` GPU power and energy (NVML).
"""

from __future__ import annotations

import time

import torch

from tuneup import hookimpl
from tuneup.plugins.measure.figures import (
    batch_size,
    percentiles,
    speed_windows,
    validation_metrics,
)
from tuneup.plugins.measure.memory import memory_available, peak_memory, reset_peak_rss
from tuneup.plugins.measure.power import GpuPower
from tuneup.plugins.measure.saved_bytes import SAVED_BYTES_MICRO_BATCH, SavedActivationBytes
from tuneup.plugins.measure.train_loss import TrainLoss
from tuneup.trainer import flops
from tuneup.trainer.state.data_order import data_shard
from tuneup.trainer.validation import BOOL, Integer, problems

#: Default of ``measure.windows``: speed windows per run (and half the loss curve's points at most).
WINDOWS = 8


class Plugin:
    def __init__(self, cfg) -> None:
        settings = cfg.get("measure") or {}
        self.warmup_steps = settings.get("warmup_steps", 2)
        self.windows = settings.get("windows", WINDOWS)
        self.measured_sizes: list[int] = []  # samples behind each of intervals_ms, in order
        self.loss = TrainLoss(2 * self.windows)
        self.fit_started = self.fit_ended = None
        self.memory_available: int | None = None
        self.power: GpuPower | None = None
        self.intervals_ms: list[float] = []  # resolved step times
        #: CUDA: (start, end, next start) events of each measured batch, not yet read
        self.pending: list = []
        self.gap_ms = 0.0  # CUDA: GPU time from batches' end events to the next start events
        self.samples = self.micro_batches = 0  # this session's (this process's)
        #: The run's totals before this session (a resumed run's checkpoint); None: not known
        #: (a checkpoint of an older tuneup)
        self.before: dict[str, int | None] = {"samples": 0, "micro_batches": 0}
        self.start_step: int | None = None  # the optimizer step this session started from
        self.measured_samples = 0
        self.wait_s = self.host_s = 0.0
        self.last_start = self.last_end = self.last_event = self.last_end_event = None
        self.skip_next = True
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
        return problems(
            cfg,
            {
                "measure.warmup_steps": Integer(low=0),
                "measure.windows": Integer(low=1),
                "measure.console_table": BOOL,
            },
        )

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
            reset_peak_rss()  # several runs in one process (a sweep): each reports its own peak

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
                self.pending.append((self.last_event, self.last_end_event, event))
            self.last_event = event
            self._drain(block=False)
        elif measured:
            self.intervals_ms.append((now - self.last_start) * 1e3)
        self.last_start = now
        self.skip_next = False
        self._batch_size = batch_size(batch)

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
        if self.device.type == "cuda":
            self.last_end_event = torch.cuda.Event(enable_timing=True)
            self.last_end_event.record()
        self.micro_batches += 1
        self.samples += self._batch_size
        self.loss.add(trainer, outputs, self._batch_size)

    @hookimpl
    def on_fit_end(self, trainer):
        self.fit_ended = time.perf_counter()
        if self.power is not None:
            self.power.stop()
        self.loss.average_over_processes(trainer)

    @hookimpl
    def on_validation_end(self, trainer):
        self.skip_next = True  # the next interval contains validation time
        self.val = validation_metrics(trainer.callback_metrics)

    def _drain(self, block: bool) -> None:
        done = 0
        for start, end_of_batch, end in self.pending:
            if not block and not end.query():
                break
            if block:
                end.synchronize()
            self.intervals_ms.append(start.elapsed_time(end))
            self.gap_ms += end_of_batch.elapsed_time(end)
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
            step_time_ms=percentiles(self.intervals_ms),
            data_wait_fraction=self._data_wait_fraction(total_ms),
            peak_memory_bytes=peak_memory(self.device),
            saved_activation_bytes=self.saved_bytes,
            **self._totals(shards),
            steps_this_session=self._session_steps(summary.get("steps")),
            micro_batches_this_session=self.micro_batches,
            samples_this_session=self.samples * shards,
            train_loss=self.loss.value(),
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
            loss_curve=self.loss.curve.values(shards, start=self.before["samples"] or 0),
            memory_available_bytes=self.memory_available,
            **self._device_time(world),
        )

    def _data_wait_fraction(self, total_ms: float) -> float | None:
        """GPU time between batches / step time on CUDA; host time blocked / host time else."""
        if self.device is not None and self.device.type == "cuda":
            return self.gap_ms / total_ms if total_ms else None
        return self.wait_s / self.host_s if self.host_s else None

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
