"""``torch.profiler`` over a window of training steps, chosen by ``profiler=off|on``.

The profiler skips ``wait`` training steps, records ``warmup`` steps without
keeping them (its own start-up cost), then keeps ``active`` steps. When the
window closes (or training ends inside it) it writes a Chrome trace,
``<run dir>/profiler/trace.json``, to open in https://ui.perfetto.dev or
chrome://tracing, and the summary gets ``profiler.top_ops_self_cpu_ms`` (and
on a GPU ``profiler.top_ops_self_cuda_ms``): the ``top_k`` operators by self
time, in milliseconds summed over the active steps (the printed table lists them
largest first; summary.json sorts keys by name).

torch's profiler is used directly rather than Lightning's ``PyTorchProfiler``:
Lightning's writes one trace per profiled action with generated names and
reports its tables as text at teardown, while here the window is stated in
training steps, the trace has a fixed path and the table lands in
``summary.json``. Steps are counted in ``on_train_batch_end`` (micro-batches,
so with gradient accumulation a step is one micro-batch). Profiling slows the
profiled steps, so the run's speed figures are not representative while it is on.
"""

from __future__ import annotations

from pathlib import Path

from torch.profiler import ProfilerActivity, profile, schedule

from tuneup import hookimpl
from tuneup.trainer.validation import BOOL, Integer, problems

RULES = {
    "profiler.wait": Integer(low=0),
    "profiler.warmup": Integer(low=0),
    "profiler.active": Integer(low=1),
    "profiler.top_k": Integer(low=1),
    "profiler.record_shapes": BOOL,
    "profiler.profile_memory": BOOL,
    "profiler.with_stack": BOOL,
}


def top_operators(prof, k: int, time: str = "self_cpu_time_total") -> dict[str, float]:
    """The ``k`` operators with the most ``time`` (an attribute of the profiler's averages:
    ``self_cpu_time_total`` or ``self_device_time_total``), name -> milliseconds, largest first."""
    averages = sorted(prof.key_averages(), key=lambda a: getattr(a, time), reverse=True)
    return {a.key: round(getattr(a, time) / 1e3, 3) for a in averages[:k] if getattr(a, time) > 0}


def trace_path(run_dir: Path, rank: int) -> Path:
    """``profiler/trace.json`` on rank 0, ``profiler/trace_rank<N>.json`` on the others."""
    return Path(run_dir) / "profiler" / ("trace.json" if rank == 0 else f"trace_rank{rank}.json")


def make_profiler(settings, on_trace_ready, cuda: bool) -> profile:
    """A ``torch.profiler.profile`` over one window: wait, warmup, then ``active`` steps."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    return profile(
        activities=activities,
        schedule=schedule(
            wait=settings.wait, warmup=settings.warmup, active=settings.active, repeat=1
        ),
        on_trace_ready=on_trace_ready,
        record_shapes=settings.record_shapes,
        profile_memory=settings.profile_memory,
        with_stack=settings.with_stack,
    )


class Plugin:
    def __init__(self, cfg) -> None:
        self.settings = cfg.profiler
        self.prof: profile | None = None
        self.path: Path | None = None
        self.top: dict[str, dict] | None = None  # the top-operator tables, once the window closed
        self.steps = 0

    @hookimpl
    def check(self, cfg):
        return problems(cfg, RULES)

    @hookimpl
    def on_fit_start(self, trainer, module):
        self.path = trace_path(trainer.default_root_dir, trainer.global_rank)
        cuda = module.device.type == "cuda"
        self.prof = make_profiler(self.settings, self._trace_ready, cuda)
        self.prof.start()

    def _trace_ready(self, prof) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(self.path))
        k = self.settings.top_k
        self.top = {"top_ops_self_cpu_ms": top_operators(prof, k)}
        if ProfilerActivity.CUDA in prof.activities:
            self.top["top_ops_self_cuda_ms"] = top_operators(prof, k, "self_device_time_total")

    @hookimpl
    def on_train_batch_end(self):
        if self.prof is not None:
            self.steps += 1
            self.prof.step()
            if self.steps >= self._window:
                self._stop()

    @property
    def _window(self) -> int:
        return self.settings.wait + self.settings.warmup + self.settings.active

    def _stop(self) -> None:
        if self.prof is not None:
            prof, self.prof = self.prof, None
            prof.stop()  # inside the active window this exports what was recorded

    @hookimpl
    def on_fit_end(self):
        self._stop()

    @hookimpl
    def on_exception(self):
        self._stop()

    @hookimpl
    def report(self, summary):
        s = self.settings
        figures = {"trace": str(self.path) if self.top is not None else None, **(self.top or {})}
        recorded = max(0, min(self.steps, self._window) - s.wait - s.warmup)
        figures["profiled_steps"] = recorded
        if self.top is None:
            figures["note"] = (
                f"training ended after {self.steps} steps, before the profiling window "
                f"(wait={s.wait} + warmup={s.warmup}) was over: lower them or train longer"
            )
        summary["profiler"] = figures

    def describe(self):
        s = self.settings
        return {"wait": s.wait, "warmup": s.warmup, "active": s.active, "top_k": s.top_k}
