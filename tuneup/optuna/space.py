"""The search space: Hydra's sweep syntax (``hydra.sweeper.params`` and the command line's
``key=choice(...)``) as Optuna distributions, and a trial's values back as overrides.

Hydra's own OverridesParser reads the syntax, as hydra-optuna-sweeper's did:

- ``choice(a, b, ...)`` -> one of the values (CategoricalDistribution);
- ``range(start, stop[, step])`` -> Python's range: ``stop`` left out (IntDistribution, or
  FloatDistribution with a step); ``shuffle(range(...))`` -> one of its values;
- ``interval(low, high)`` -> uniform in [low, high] (int when both ends are);
  ``tag(log, interval(...))`` -> log-uniform;
- a plain value fixes the key for every trial (the command line's value wins over the file's).

A sweep Optuna would refuse when a trial samples it (an empty or reversed interval, a log
scale from 0, a range with no values or a step <= 0, an empty choice) is refused here, when
the space is parsed, before any trial or baseline runs: one line naming the key and what is
allowed (space_checks.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Glob, Override, Transformer
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from tuneup import TuneupError
from tuneup.optuna.space_checks import interval_problem, parsed, range_problem


@dataclass
class Space:
    """What a trial samples (``distributions``) and what every trial gets as it is (``fixed``)."""

    distributions: dict[str, BaseDistribution] = field(default_factory=dict)
    fixed: dict[str, str] = field(default_factory=dict)

    def overrides(self, params: dict) -> list[str]:
        """A trial's command-line overrides: its sampled values, then the fixed ones."""
        sampled = [f"{key}={override_value(value)}" for key, value in params.items()]
        return sampled + [f"{key}={value}" for key, value in self.fixed.items()]

    def grid(self) -> dict[str, list]:
        """Every value of every parameter, for GridSampler: choice() and range() only."""
        return {key: grid_values(key, d) for key, d in self.distributions.items()}


def parse_space(params: dict | None, arguments: list[str]) -> Space:
    """The space from ``hydra.sweeper.params`` then the command line (a later key wins)."""
    lines = [f"{key}={value}" for key, value in (params or {}).items()] + list(arguments)
    space = Space()
    for override in parsed(lines):
        key = override.get_key_element()
        space.distributions.pop(key, None)
        space.fixed.pop(key, None)
        if override.is_sweep_override():
            space.distributions[key] = distribution(override)
        else:
            space.fixed[key] = override.get_value_element_as_str()
    return space


def distribution(override: Override) -> BaseDistribution:
    """One sweep override as an Optuna distribution; a sweep Optuna cannot sample is refused."""
    if isinstance(override.value(), Glob):
        raise _unsupported(override)
    if override.is_range_sweep() and (problem := range_problem(override)):
        raise TuneupError(problem)
    if override.is_choice_sweep() or (override.is_range_sweep() and override.value().shuffle):
        return CategoricalDistribution(_values(override))
    if override.is_range_sweep():
        values, step = _values(override), override.value().step
        if all(isinstance(v, int) for v in values):
            return IntDistribution(values[0], values[-1], step=int(step))
        return FloatDistribution(float(values[0]), float(values[-1]), step=float(step))
    if override.is_interval_sweep():
        interval = override.value()
        log = "log" in interval.tags
        if problem := interval_problem(override):
            raise TuneupError(problem)
        if isinstance(interval.start, int) and isinstance(interval.end, int):
            return IntDistribution(interval.start, interval.end, log=log)
        return FloatDistribution(float(interval.start), float(interval.end), log=log)
    raise _unsupported(override)


def _unsupported(override: Override) -> TuneupError:
    return TuneupError(
        f"{override.input_line}: the Optuna sweeper cannot sample this sweep; use choice(...), "
        "range(...), interval(low, high) or tag(log, interval(low, high))"
    )


def _values(override: Override) -> list:
    values = list(override.sweep_iterator(transformer=Transformer.encode))
    for value in values:
        if not isinstance(value, (str, int, float, bool, type(None))):
            raise TuneupError(
                f"{override.input_line}: a choice takes plain values (str, int, float, bool, "
                f"null), not {value!r}"
            )
    return values


def grid_values(key: str, distribution: BaseDistribution) -> list:
    if isinstance(distribution, CategoricalDistribution):
        return list(distribution.choices)
    step = getattr(distribution, "step", None)
    if step is None or getattr(distribution, "log", False):
        raise TuneupError(
            f"hydra.sweeper.params.{key}: the grid sampler takes choice() and range() "
            "parameters; an interval has no grid (give choice(...) or range(...))"
        )
    count = round((distribution.high - distribution.low) / step) + 1
    return [distribution.low + i * step for i in range(count)]


def override_value(value) -> str:
    """A value as Hydra reads it back: strings quoted when they would not parse as themselves."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    text = str(value)
    if isinstance(value, str) and not _plain(text):
        escaped = text.replace("\\", "\\\\").replace("'", "\\'")
        return f"'{escaped}'"
    return text


def _plain(text: str) -> bool:
    """Whether Hydra reads ``text`` unquoted as this same string."""
    try:
        parsed = OverridesParser.create().parse_override(f"k={text}")
    except Exception:  # any parse error: quote it
        return False
    return not parsed.is_sweep_override() and parsed.value() == text
