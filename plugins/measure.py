"""Always-on measurement: samples/s, step-time percentiles, data wait, peak memory, loss, metrics.

Cheap by construction: no device synchronisation per step. On CPU a step's
time is read from ``perf_counter``; on CUDA a timing event is recorded at each
batch start (asynchronous) and the elapsed times are read only once the events
have completed, so the GPU queue is never drained for measurement.

Definitions (all over the steady state: the first ``measure.warmup_steps``
micro-batches and the first step after each validation are left out):

- step time: from one training micro-batch start to the next, i.e. it includes
  fetching the next batch; p50 and p90 in milliseconds.
- samples/s: samples in the measured steps (all ranks) / their total time.
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
"""

from __future__ import annotations

import resource
import statistics
import sys
import time

import torch

from tuneup import hookimpl
from tuneup.trainer import flops
from tuneup.trainer.validation import Integer, problems

#: The training micro-batch (0-based, counted over the run) whose forward is measured for
#: saved_activation_bytes: the 2nd, so the first step's one-time work is not in it.
SAVED_BYTES_MICRO_BATCH = 1


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
        self.exclude = {t.untyped_storage().data_ptr() for t in tensors}
        self.storages: dict[int, int] = {}
        self.hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self.hooks.__enter__()

    def _pack(self, tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in self.exclude:
            self.storages[storage.data_ptr()] = storage.nbytes()
        return tensor.detach()  # not the tensor itself: that would make a reference cycle

    def stop(self) -> int:
        self.hooks.__exit__(None, None, None)
        return sum(self.storages.values())


class Plugin:
    def __init__(self, cfg) -> None:
        settings = cfg.get("measure") or {}
        self.warmup_steps = settings.get("warmup_steps", 2)
        self.intervals_ms: list[float] = []  # resolved step times
        self.pending: list = []  # CUDA: (start_event, next_start_event) pairs not yet read
        self.samples = self.micro_batches = 0
        self.measured_samples = 0
        self.wait_s = self.host_s = 0.0
        self.last_start = self.last_end = self.last_event = None
        self.skip_next = True
        self.last_loss = None
        self.val: dict[str, float] = {}
        self.device = None
        self.flops_per_sample: float | None = None
        self.saved: SavedActivationBytes | None = None  # counting during one forward
        self.saved_bytes: int | None = None
        self.plan = None

    @hookimpl
    def check(self, cfg, plan):
        self.plan = plan  # what is trained, for its FLOPs once training starts
        return problems(cfg, {"measure.warmup_steps": Integer(low=0)})

    @hookimpl
    def on_fit_start(self, cfg, trainer, module):
        self.device = module.device
        if self.plan is not None:
            self.flops_per_sample = flops.flops_per_sample(self.plan)  # meta: no compute
        self.world_size = trainer.world_size
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            _reset_peak_rss()  # several runs in one process (a sweep): each reports its own peak

    @hookimpl(tryfirst=True)
    def on_train_batch_start(self, batch, module):
        if self.micro_batches == SAVED_BYTES_MICRO_BATCH:
            self.saved = SavedActivationBytes(module)  # stopped before this batch's backward
        now = time.perf_counter()
        measured = not self.skip_next and self.micro_batches >= self.warmup_steps
        if measured:
            self.wait_s += now - self.last_end
            self.host_s += now - self.last_start
            self.measured_samples += self._batch_size
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
        world = getattr(self, "world_size", 1)
        summary.update(
            samples_per_s=self.measured_samples * world / (total_ms / 1e3) if total_ms else None,
            step_time_ms=_percentiles(self.intervals_ms),
            data_wait_fraction=self.wait_s / self.host_s if self.host_s else None,
            peak_memory_bytes=_peak_memory(self.device),
            saved_activation_bytes=self.saved_bytes,
            micro_batches=self.micro_batches,
            samples=self.samples * world,
            train_loss=float(self.last_loss) if self.last_loss is not None else None,
            val=self.val,
        )
        speed, device = summary["samples_per_s"], summary.get("device", "")
        summary.update(flops.throughput(self.flops_per_sample, speed, device, world))

    def describe(self):
        return {"warmup_steps": self.warmup_steps}


def _batch_size(batch) -> int:
    """Samples in a batch: the length of its first tensor (a tuple, list or dict batch)."""
    from tuneup.trainer.components import first_tensor

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


def _peak_memory(device) -> int:
    if device is not None and device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)  # Linux reports KiB


def _reset_peak_rss() -> None:
    """Linux: start the process's peak-RSS record (VmHWM, ru_maxrss) again from the current RSS."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:  # not Linux, or not allowed: the peak then covers the whole process
        pass
