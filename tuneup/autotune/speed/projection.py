"""What the recipe saves on the user's full run: device-hours (GPU-hours on GPUs) and energy.

The full run's samples: ``autotune.samples``, or ``autotune.epochs`` x the training set's
size, or else the user's own limits (``trainer.max_steps`` x samples per optimizer step,
``trainer.max_epochs`` x the training set's size). Its time: those samples at the
baseline's measured samples/s (the median of its trials' steady state), and the recipe's
at that speed x the confirmed speed-up, with the speed-up's interval. Device-hours are that
time x the processes (one device each); energy is the trials' mean GPU power (NVML,
summary.json's ``gpu_power_w``) x the GPU-hours. Training steps only: no validation,
checkpoints or start-up, which the recipe does not change.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable


def full_run(settings, cfg, effective_batch: int | None, train_size: Callable[[], int | None]):
    """(samples the full run trains or None, where the number comes from)."""
    if settings.samples:
        return settings.samples, f"autotune.samples={settings.samples}"
    trainer = cfg.get("trainer") or {}
    steps, epochs = trainer.get("max_steps", -1), trainer.get("max_epochs", -1)
    if not settings.epochs and isinstance(steps, int) and steps > 0 and effective_batch:
        return (
            steps * effective_batch,
            f"trainer.max_steps={steps} x {effective_batch} samples per step",
        )
    epochs = settings.epochs or (epochs if isinstance(epochs, int | float) and epochs > 0 else None)
    if not epochs:
        return None, "no run length: give autotune.epochs or autotune.samples"
    size = train_size()
    if not size:
        return None, "the training set's size is unknown: give autotune.samples"
    key = "autotune.epochs" if settings.epochs else "trainer.max_epochs"
    return round(epochs * size), f"{key}={epochs:g} x {size:,} training samples"


def project(samples: int | None, source: str, baseline: list[dict], recipe: list[dict], interval):
    """The projection for ``samples``: ``baseline``/``recipe`` are their trials' summaries,
    ``interval`` the confirmed speed-up (None: the recipe is the baseline)."""
    speed = _median(s.get("samples_per_s") for s in baseline)
    world = int((baseline[0] if baseline else {}).get("world_size") or 1)
    gpu = bool(baseline) and (baseline[0].get("gpu_hours") or 0) > 0
    found = {
        "samples": samples,
        "from": source,
        "world_size": world,
        "unit": "GPU-hours" if gpu else "CPU process-hours",
    }
    if samples is None or not speed:
        return found
    base_hours = samples / speed / 3600 * world
    found["baseline"] = _side(speed, base_hours, baseline)
    ratio = interval.estimate if interval else 1.0
    found["recipe"] = _side(speed * ratio, base_hours / ratio, recipe or baseline)
    if interval is not None and interval.low > 0:
        found["recipe"]["device_hours_range"] = [
            base_hours / interval.high,
            base_hours / interval.low,
        ]
    found["saved_device_hours"] = base_hours - found["recipe"]["device_hours"]
    return found


def _side(speed: float, hours: float, summaries: list[dict]) -> dict:
    power = _median(s.get("gpu_power_w") for s in summaries)
    return {
        "samples_per_s": speed,
        "device_hours": hours,
        "gpu_power_w": power,
        "energy_kwh": power * hours / 1000 if power else None,
    }


def _median(values) -> float | None:
    found = [v for v in values if isinstance(v, int | float) and v > 0]
    return statistics.median(found) if found else None
