"""Value checks for config keys: each problem names the key, the bad value and what is allowed.

Rules are small callables; ``problems(cfg, rules)`` applies a table of them to
whichever keys are present. Plugins use the same rules in their ``check`` hook.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from omegaconf import OmegaConf

_ABSENT = object()


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _same(value, options) -> bool:
    """``value in options``, but True is not 1 and 1 is not 1.0."""
    return any(value == option and type(value) is type(option) for option in options)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True)
class Integer:
    """An integer in [low, high]; ``also`` lists extra accepted values (e.g. -1 or None)."""

    low: int | None = None
    high: int | None = None
    also: tuple = ()
    note: str = ""

    def __call__(self, value) -> bool:
        if _same(value, self.also):
            return True
        if not _is_int(value):
            return False
        return (self.low is None or value >= self.low) and (self.high is None or value <= self.high)

    def __str__(self) -> str:
        bounds = [
            f">= {self.low}" if self.low is not None else "",
            f"<= {self.high}" if self.high is not None else "",
        ]
        text = "an integer " + " and ".join(b for b in bounds if b)
        if self.also:
            text += " or " + " or ".join(repr(a) for a in self.also)
        return text.strip() + (f" ({self.note})" if self.note else "")


@dataclass(frozen=True)
class Number:
    """A real number with optional strict (gt/lt) or inclusive (ge/le) bounds."""

    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None
    also: tuple = ()

    def __call__(self, value) -> bool:
        if _same(value, self.also):
            return True
        if not _is_number(value):
            return False
        return (
            (self.gt is None or value > self.gt)
            and (self.ge is None or value >= self.ge)
            and (self.lt is None or value < self.lt)
            and (self.le is None or value <= self.le)
        )

    def __str__(self) -> str:
        bounds = [
            f"{op} {bound}"
            for op, bound in ((">", self.gt), (">=", self.ge), ("<", self.lt), ("<=", self.le))
            if bound is not None
        ]
        text = "a number " + " and ".join(bounds)
        return text + "".join(f" or {a!r}" for a in self.also)


@dataclass(frozen=True)
class OneOf:
    """One of a fixed set of values."""

    options: tuple

    def __call__(self, value) -> bool:
        return _same(value, self.options)

    def __str__(self) -> str:
        return "one of " + ", ".join(repr(o) for o in self.options)


BOOL = OneOf((True, False))


def problems(cfg, rules: Mapping[str, object]) -> list[str]:
    """Apply ``rules`` (dotted key -> rule) to the keys present in ``cfg``."""
    found = []
    for key, rule in rules.items():
        value = OmegaConf.select(cfg, key, default=_ABSENT, throw_on_missing=False)
        if value is _ABSENT:
            continue
        if not rule(value):
            found.append(problem(key, value, rule))
    return found


def problem(key: str, value, allowed) -> str:
    """The one message format for a bad value."""
    return f"{key}={value!r} is not allowed: expected {allowed}"
