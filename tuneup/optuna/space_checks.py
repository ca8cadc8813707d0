"""What a sweep must be for Optuna to sample it, checked when the space is parsed.

Optuna refuses an empty or reversed interval, a log scale from 0 and a range step <= 0 only
when a trial asks for the value (``ValueError: low <= high must hold``), which in a sweep is
after the first job has trained, and then as a traceback. Checked here instead, each is one
line that names the key, the sweep as given and what is allowed, before anything runs: both
sweepers parse their space first (tuneup/optuna/sweeper.py, tuneup/autotune/preflight.py).
"""

from __future__ import annotations

import math

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import HydraException

from tuneup import TuneupError

ALLOWED = (
    "a value, choice(a, b, ...), range(start, stop[, step]), interval(low, high) or "
    "tag(log, interval(low, high))"
)


def parsed(lines: list[str]) -> list[Override]:
    """Hydra's parse of each line; one it refuses (``choice()``, an unclosed bracket) is one
    line naming it, not Hydra's three lines and a grammar link."""
    parser, found = OverridesParser.create(), []
    for line in lines:
        try:
            found += parser.parse_overrides([line])
        except HydraException as exc:
            reason = [
                text
                for text in str(exc).strip().splitlines()
                if text and not text.startswith(("Error parsing override", "See https://"))
            ]
            why = "; ".join(reason) or type(exc).__name__
            raise TuneupError(f"{line}: {why}; expected {ALLOWED}") from exc
    return found


def interval_problem(override: Override) -> str | None:
    """Why Optuna cannot sample this ``interval(low, high)``, or None."""
    sweep, shown = override.value(), _shown(override)
    low, high, log = sweep.start, sweep.end, "log" in sweep.tags
    if not (math.isfinite(low) and math.isfinite(high)):
        return f"{shown}: the interval's ends must be finite numbers, not {low:g} and {high:g}"
    if low > high:
        swapped = f"interval({high:g}, {low:g})"
        return (
            f"{shown}: the interval is empty: its low end {low:g} is above its high end "
            f"{high:g}; give the low end first: {f'tag(log, {swapped})' if log else swapped}"
        )
    integer = isinstance(low, int) and isinstance(high, int)  # Optuna: low >= 1, else > 0
    if log and (low < 1 if integer else low <= 0):
        above = "at least 1" if integer else "above 0"
        example = f"tag(log, interval({high / 1000:g}, {high:g}))" if high > 0 else ""
        return (
            f"{shown}: a log scale needs a low end {above}, not {low:g}; give "
            + (f"e.g. {example}, or " if example else "")
            + f"interval({low:g}, {high:g}) without tag(log, ...)"
        )
    return None


def range_problem(override: Override) -> str | None:
    """Why Optuna cannot sample this ``range(start, stop[, step])`` (or its ``shuffle``), or
    None: Python's range with a step above 0 and at least one value."""
    sweep, shown = override.value(), _shown(override)
    start, stop, step = sweep.start, sweep.stop, sweep.step
    if not step > 0:
        low, high = sorted((start, stop))
        return f"{shown}: a range's step must be above 0, not {step}; e.g. range({low}, {high})"
    if not start < stop:
        return (
            f"{shown}: the range is empty: start {start} is not below stop {stop} (the stop "
            f"is left out, as in Python); give start < stop, e.g. range({stop}, {start + step})"
            if start > stop
            else f"{shown}: the range is empty: start {start} is not below stop {stop} (the "
            "stop is left out, as in Python); give start < stop"
        )
    return None


def _shown(override: Override) -> str:
    """The sweep as the user wrote it: ``model.lr=tag(log, interval(0.3, 1e-4))``."""
    return override.input_line or f"{override.get_key_element()}={override.get_value_string()}"
