"""Progressive resizing, chosen by ``progressive_resize=off|on``: smaller training images early on.

FFCV's ResNet recipes train at 160 px first and grow to 192 px towards the end: early
steps, which learn coarse features, cost a fraction of a full-size step. The image side
follows a schedule over the training's optimizer steps (:func:`size_at`, FFCV's
``get_resolution``): ``start_size`` until ``start_fraction`` of the steps, then a linear
ramp to ``end_size`` (null: the data's own size) at ``end_fraction``, rounded to a
multiple of ``step``. Each training batch is resized on the device in ``transform_batch``
(``F.interpolate``, bilinear, antialiased when shrinking) before the other plugins see it
(``tryfirst``: augmentation then works on the smaller image); validation runs at the
data's full size. The output keeps the batch's memory format (channels_last stays so).

Under ``compile=on`` a new size is a new input shape: torch.compile recompiles. The
schedule has few sizes (a multiple of ``step`` each: ``sizes`` in the summary), dynamo's
recompile limit is raised to hold them all, and the summary counts the graphs compiled
after the first training step (``progressive_resize.recompiles``, from
``torch._dynamo.utils.counters``): at most one per new size (2 for the sizes 16, 24, 32
on a CPU with the default ``compile.dynamic=null``).

The size of each step is in the summary (``image_size_schedule``: the step at which each
size began) and in the logged metrics (``train/image_size``).
"""

from __future__ import annotations

import math

import torch
from torch.nn import functional as F

from tuneup import TuneupError, hookimpl
from tuneup.trainer.validation import Integer, Number, problems

RULES = {
    "progressive_resize.start_size": Integer(low=8),
    "progressive_resize.end_size": Integer(low=8, also=(None,), note="null: the data's size"),
    "progressive_resize.start_fraction": Number(ge=0, le=1),
    "progressive_resize.end_fraction": Number(ge=0, le=1),
    "progressive_resize.step": Integer(low=1),
}


def size_at(
    progress: float, start: int, end: int, start_fraction: float, end_fraction: float, step: int
) -> int:
    """The image side at ``progress`` (0 to 1) through training: ``start`` until
    ``start_fraction``, linear to ``end`` at ``end_fraction``, then ``end``; rounded to a
    multiple of ``step``."""
    if progress <= start_fraction or end_fraction <= start_fraction:
        side = start if progress <= start_fraction else end
    elif progress >= end_fraction:
        side = end
    else:
        side = start + (end - start) * (progress - start_fraction) / (end_fraction - start_fraction)
    return round(side / step) * step


def schedule_sizes(total_steps: int, *args) -> list[int]:
    """Every distinct side the schedule (``size_at``'s settings) gives over ``total_steps``."""
    return sorted({size_at(i / total_steps, *args) for i in range(total_steps)})


def resize(images: torch.Tensor, side: int) -> torch.Tensor:
    """``[B, C, H, W]`` images to ``side x side`` (bilinear, antialiased when shrinking), in
    the memory format they came in."""
    if images.shape[-2:] == (side, side):
        return images
    layout = torch.channels_last if _channels_last(images) else torch.contiguous_format
    shrink = side < images.shape[-1]
    out = F.interpolate(
        images, size=(side, side), mode="bilinear", antialias=shrink, align_corners=False
    )
    return out.contiguous(memory_format=layout)


def _channels_last(images: torch.Tensor) -> bool:
    return images.shape[1] > 1 and images.is_contiguous(memory_format=torch.channels_last)


def graphs_compiled() -> int:
    """Graphs torch.compile (dynamo) has compiled in this process so far."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def model_problem(model, shape, side: int, name: str) -> str | None:
    """Why ``model`` cannot take ``side x side`` images (shape-checked on the meta device)."""
    try:
        with torch.no_grad():
            model(torch.empty(2, shape[0], side, side, device="meta"))
    except Exception as error:  # any failure means the size does not fit
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return (
            f"progressive_resize: model={name} cannot take {side}x{side} images (the schedule's "
            f"smallest): {first[:160]}; use a model that pools over the image (small_resnet, "
            "resnet18...), a larger start_size, or progressive_resize=off"
        )
    return None


class Plugin:
    def __init__(self, cfg) -> None:
        self.settings = cfg.progressive_resize
        self.compiling = cfg.get("compile", {}).get("name") == "on"
        self.full: int | None = None  # the data's side
        self.trainer = None
        self.total = 1
        self.current: int | None = None
        self.schedule: list[dict] = []  # {"step", "size"} where each size began
        self.sizes: list[int] = []
        self.train_graphs = 0
        self.first_step_graphs: int | None = None
        self._graphs_before: int | None = None

    def _args(self) -> tuple:
        s = self.settings
        end = self.full if s.get("end_size") is None else s.end_size
        return s.start_size, end, s.start_fraction, s.end_fraction, s.step

    @hookimpl
    def check(self, cfg, plan):
        found = problems(cfg, RULES)
        if found or not plan.sound:
            return found
        s, shape = self.settings, plan.input_shape
        if plan.task.name != "classification" or shape is None or len(shape) != 3:
            return [
                f"progressive_resize=on resizes image batches [B, C, H, W] for "
                f"classification, but data={plan.data_name} gives samples of shape "
                f"{None if shape is None else list(shape)} (task={plan.task.name}); use "
                "progressive_resize=off"
            ]
        if shape[1] != shape[2]:
            return [
                f"progressive_resize=on makes square images, but data={plan.data_name} gives "
                f"{shape[1]}x{shape[2]}; use progressive_resize=off"
            ]
        self.full = shape[1]
        for key in ("start_size", "end_size"):
            value = s.get(key)
            if value is not None and value % s.step:
                found.append(
                    f"progressive_resize.{key}={value} is not allowed: expected a "
                    f"multiple of progressive_resize.step={s.step} (the schedule "
                    "rounds to it)"
                )
        if s.start_fraction > s.end_fraction:
            found.append(
                f"progressive_resize.start_fraction={s.start_fraction} is above "
                f"end_fraction={s.end_fraction}: the ramp starts before it ends; swap "
                "them"
            )
        trainer = cfg.trainer
        if trainer.get("max_steps", -1) in (-1, None) and trainer.get("max_epochs") in (-1, None):
            found.append(
                "progressive_resize=on schedules over the training's steps, but "
                "trainer.max_steps and trainer.max_epochs are both -1 (no end); set "
                "one of them"
            )
        model = plan.meta_model()
        if not found and model is not None:
            reason = model_problem(
                model, shape, min(s.start_size, self._args()[1]), plan.model_name
            )
            found += [reason] if reason else []
        return found

    @hookimpl
    def on_fit_start(self, trainer):
        self.trainer = trainer
        total = trainer.estimated_stepping_batches
        if not math.isfinite(total):
            raise TuneupError(
                "progressive_resize=on needs a known number of training steps "
                "(trainer.max_steps or trainer.max_epochs)"
            )
        self.total = max(1, int(total))
        self.sizes = schedule_sizes(self.total, *self._args())
        if self.compiling:  # one graph per size at most: dynamo must not give up before
            import torch._dynamo

            config = torch._dynamo.config
            config.recompile_limit = max(config.recompile_limit, len(self.sizes) + 1)

    @hookimpl(tryfirst=True)  # before augmentation and the memory format: they see the new size
    def transform_batch(self, batch):
        if self.trainer is None or not self.trainer.training:
            return None  # validation at the data's full size
        step = self.trainer.global_step
        side = size_at(step / self.total, *self._args())
        if side != self.current:
            self.current = side
            self.schedule.append({"step": step, "size": side})
        images, *rest = batch
        return [resize(images, side), *rest]

    @hookimpl
    def on_train_batch_start(self, module):
        if self.current is not None and self.trainer._logger_connector.should_update_logs:
            module.log("train/image_size", float(self.current))
        if self.compiling:
            self._graphs_before = graphs_compiled()

    @hookimpl
    def on_train_batch_end(self):
        if self._graphs_before is None:
            return
        new = graphs_compiled() - self._graphs_before
        self.train_graphs += new
        if self.first_step_graphs is None:
            self.first_step_graphs = new

    @hookimpl
    def report(self, summary):
        summary["image_size_schedule"] = self.schedule
        if self.compiling and self.first_step_graphs is not None:
            summary["recompiles"] = self.train_graphs - self.first_step_graphs

    def state_dict(self):
        return {"schedule": self.schedule}  # a resumed run's summary shows the whole schedule

    def load_state_dict(self, state):
        self.schedule = list(state.get("schedule", []))
        self.current = self.schedule[-1]["size"] if self.schedule else None

    def describe(self):
        found = {
            key: self.settings.get(key)
            for key in ("name", "start_size", "end_size", "start_fraction", "end_fraction", "step")
        }
        if self.sizes:
            found["sizes"] = self.sizes
        if self.compiling and self.first_step_graphs is not None:
            found["recompiles"] = self.train_graphs - self.first_step_graphs
            found["recompile_bound"] = len(self.sizes) - 1
        return found
