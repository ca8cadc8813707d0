"""The run's record toward a target: its clock, the metric at each validation, the crossing.

A :class:`Race` keeps only host times (``time.perf_counter``) taken at the first training step
of a session, at each validation's start and end, and the metric read at validation end, so
no training step waits for the device. Its :meth:`Race.state_dict` carries the run's totals
into a checkpoint; a resumed session adds its own time to them, so figures are the run's,
not the session's. What a killed session did after its last checkpoint is lost work, as its
steps are: neither its time nor its validations are in the resumed run's figures.
"""

from __future__ import annotations

import math
import struct
import time


def reached(value: float, target: float, mode: str) -> bool:
    """Whether ``value`` is at the target: at least it (mode max) or at most it (mode min),
    compared at float32 precision. Lightning logs metrics as float32 tensors: 342 of 360
    right is 0.949999988, below the float64 0.95 that ``target.value=0.95`` is, though it
    is 95.0 %; in float32 both are the same number."""
    value, target = _float32(value), _float32(target)
    return value >= target if mode == "max" else value <= target


def _float32(number: float) -> float:
    """``number`` rounded to the nearest float32, as a Python float."""
    return struct.unpack("f", struct.pack("f", number))[0]


def better(value: float, best: float | None, mode: str) -> bool:
    if best is None or math.isnan(best):
        return not math.isnan(value)
    return value > best if mode == "max" else value < best


#: The most validations ``target_history`` keeps: past it, every other older entry goes (the
#: first and the newest stay; the crossing and the best are kept apart, whole), so a long run's
#: summary and checkpoint stay small and the history still spans the whole run.
HISTORY_LIMIT = 1000


def thinned(history: list[dict], limit: int = HISTORY_LIMIT) -> list[dict]:
    """``history`` as it is when within ``limit``, else every other entry and the newest."""
    if len(history) <= limit:
        return history
    return [*history[:-1:2], history[-1]]


class Race:
    """Wall time from the first step, validation time, samples seen and the metric's history.

    ``value`` None: no target, only the best value (a budget run, ``trainer.max_time``).
    """

    def __init__(self, metric: str, value: float | None, mode: str, clock=time.perf_counter):
        self.metric, self.value, self.mode, self.clock = metric, value, mode, clock
        self.before_s = 0.0  # wall time of earlier sessions (from the checkpoint)
        self.started: float | None = None  # this session's clock start
        self.validation_s = 0.0  # the run's, earlier sessions included
        self.validation_started: float | None = None
        self.validations = 0
        self.samples = 0  # the run's, all processes
        self.history: list[dict] = []
        self.best: float | None = None
        self.best_step: int | None = None
        self.crossing: dict | None = None  # the history entry where the target was reached
        self.energy_before_j = 0.0  # energy of earlier sessions

    # -- the clock --------------------------------------------------------------------------

    def start(self) -> None:
        """The session's first step (or validation): its clock starts, once."""
        if self.started is None:
            self.started = self.clock()

    def elapsed(self) -> float:
        """The run's wall time so far, earlier sessions included."""
        return self.before_s + (self.clock() - self.started if self.started is not None else 0.0)

    def add_samples(self, samples: int) -> None:
        self.samples += samples

    def validation_start(self) -> None:
        self.start()
        self.validation_started = self.clock()

    def validation_end(self, step: int, value: float, energy_j: float | None = None) -> bool:
        """Record one validation's metric ``value`` at optimizer ``step``; True when this one
        reaches the target for the first time."""
        if self.validation_started is not None:
            self.validation_s += self.clock() - self.validation_started
            self.validation_started = None
        self.validations += 1
        time_s = self.elapsed()
        entry = {
            "step": step,
            "samples": self.samples,
            "time_s": time_s,
            "train_time_s": time_s - self.validation_s,
            "value": value,
        }
        self.history.append(entry)
        self.history = thinned(self.history)
        if better(value, self.best, self.mode):
            self.best, self.best_step = value, step
        if self.crossing is not None or self.value is None:
            return False
        if not reached(value, self.value, self.mode):
            return False
        self.crossing = {**entry, "energy_j": energy_j}
        return True

    # -- the summary ------------------------------------------------------------------------

    def figures(self, world_size: int, gpu: bool = False) -> dict:
        """The summary's target figures (keys as docs/race.md lists them); ``gpu``: the
        devices are GPUs (gpu_hours_to_target counts GPUs only, as gpu_hours does)."""
        cross = self.crossing
        time_s = cross["time_s"] if cross else None
        hours = time_s * world_size / 3600 if cross else None
        energy = cross.get("energy_j") if cross else None
        return {
            "target": {
                "metric": self.metric,
                "value": self.value,
                "mode": self.mode,
                "reached": None if self.value is None else cross is not None,
                "best": self.best,
                "best_step": self.best_step,
            },
            "time_to_target_s": time_s,
            "time_to_target_train_s": cross["train_time_s"] if cross else None,
            "steps_to_target": cross["step"] if cross else None,
            "samples_to_target": cross["samples"] if cross else None,
            "device_hours_to_target": hours,
            "gpu_hours_to_target": (hours if gpu else 0.0) if cross else None,
            "energy_kwh_to_target": energy * world_size / 3.6e6 if energy is not None else None,
            "target_history": self.history,
            "validation_time_s": self.validation_s,
            "validations": self.validations,
        }

    # -- exact resume ----------------------------------------------------------------------

    def state_dict(self, energy_j: float | None = None) -> dict:
        """The run's totals now (``energy_j``: the run's energy so far, where it is measured)."""
        return {
            "time_s": self.elapsed(),
            "validation_s": self.validation_s,
            "validations": self.validations,
            "samples": self.samples,
            "history": [dict(e) for e in self.history],
            "best": self.best,
            "best_step": self.best_step,
            "crossing": self.crossing,
            "energy_j": energy_j,
            "metric": self.metric,
            "value": self.value,
            "mode": self.mode,
        }

    def load_state_dict(self, state: dict) -> None:
        """The run's totals from a checkpoint. A resumed run with another target keeps the
        times; its crossing is found again in the history (another metric: none kept)."""
        self.before_s = state.get("time_s", 0.0)
        self.started = None  # this session's clock starts at its first step
        self.validation_s = state.get("validation_s", 0.0)
        self.validations = state.get("validations", 0)
        self.samples = state.get("samples", 0)
        self.energy_before_j = state.get("energy_j") or 0.0
        if state.get("metric", self.metric) != self.metric:
            return  # the history is another metric's
        self.history = [dict(e) for e in state.get("history", [])]
        self.best, self.best_step = state.get("best"), state.get("best_step")
        self.crossing = state.get("crossing")
        if (state.get("value"), state.get("mode")) != (self.value, self.mode):
            self.best = self.best_step = self.crossing = None
            for entry in self.history:  # as if validated under this target
                if better(entry["value"], self.best, self.mode):
                    self.best, self.best_step = entry["value"], entry["step"]
                if (
                    self.crossing is None
                    and self.value is not None
                    and reached(entry["value"], self.value, self.mode)
                ):
                    self.crossing = {**entry, "energy_j": None}
