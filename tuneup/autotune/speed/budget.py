"""The search's budget: the wall time it may spend and what each trial is expected to cost.

Kept apart from the walk (search.py), which asks it two things: whether a trial still fits,
and how long a trial may run. :class:`Budget` is the seconds and the clock;
:class:`Costs` holds the search's estimates, mixed into :class:`~.search.Search`, whose
settings, Lab, checks and recipe so far they read.

The budget (``autotune.budget_minutes``, wall time from the sweep's start): a round takes
the reference and the candidates (cheapest first) whose expected trials, plus the
confirmation's, fit in what is left; extra rounds beyond the minimum also leave room for
the later dimensions' minimum. A trial's expected cost is the median of its
configuration's last three trials, or the reference's scaled by the batch size for a new
one; a trial is started only while its expected cost fits in what is left, and its time
limit (:meth:`Costs.time_limit`) ends it inside the budget, so a machine that slows down
cuts a candidate short rather than overrunning. A configuration's first trial with
``compile`` on is expected to take at least :data:`FIRST_COMPILE_S`: Lightning checks
``trainer.max_time`` between steps, and the first compiled step holds the compilation, which
no limit cuts. A dimension the budget does not reach is not tried.
"""

from __future__ import annotations

import re
import statistics
import time

from tuneup.autotune.trials import BASELINE, label

MIN_TRIAL_LIMIT_S = 60.0
#: A configuration's first trial with ``compile`` on is expected to take at least this: its
#: first step holds the compilation, which ``trainer.max_time`` cannot cut (Lightning checks it
#: between steps), so a budget is planned with it (the least limit a trial gets, for the same
#: reason).
FIRST_COMPILE_S = MIN_TRIAL_LIMIT_S


def compiles(overrides: tuple[str, ...]) -> bool:
    """Whether ``overrides`` turn torch.compile on (``compile=...`` other than off)."""
    return any(
        o.lstrip("+~").split("=")[0] == "compile" and o.split("=", 1)[1] not in ("off", "null")
        for o in overrides
        if "=" in o
    )


class Budget:
    def __init__(self, seconds: float, clock=time.monotonic) -> None:
        self.seconds, self.clock, self.started = seconds, clock, clock()

    @property
    def elapsed(self) -> float:
        return self.clock() - self.started

    def allows(self, seconds: float) -> bool:
        return self.seconds - self.elapsed >= seconds


class Costs:
    """The search's estimates of its trials' seconds, and the room it keeps for what comes
    later; reads the search's ``settings``, ``lab``, ``checks``, ``budget``, ``baseline``,
    ``recipe`` and ``dimension_index``."""

    def time_limit(self, overrides: tuple[str, ...]) -> float:
        """A trial's limit: autotune.trial_time_factor x the baseline's trial (x the batch
        factor), at least a minute (a first compile), and at most what is left of the budget
        (so a slow first compile cannot run past it). A candidate that slow cannot be the
        fastest; what it ran is measured."""
        times = [t.seconds for t in self.lab.trials[1:] if t.label == BASELINE]
        typical = statistics.median(times or [self.baseline.seconds])
        factor = self.settings.trial_time_factor * self._batch_factor(overrides, ())
        left = self.budget.seconds - self.budget.elapsed - self._start_up()  # never past it
        return min(max(1.0, left), max(MIN_TRIAL_LIMIT_S, factor * typical))

    def _start_up(self) -> float:
        """A trial's seconds outside its ``trainer.max_time`` (the process's start, the
        model's build), bounded by the fastest trial's seconds: a limit of what is left less
        this ends the trial inside the budget."""
        return min((t.seconds for t in self.lab.trials), default=0.0)

    def estimate(self, overrides: tuple[str, ...]) -> float:
        """Expected seconds of one trial of this configuration (see the module docstring)."""
        own = self._recent_seconds(label(overrides))
        if own:
            return statistics.median(own)
        reference = self._recent_seconds(label(self.recipe)) or [
            t.seconds for t in self.lab.trials[:1]
        ]
        base = statistics.median(reference) if reference else 0.0
        first = base * self._batch_factor(overrides, self.recipe)
        return max(first, FIRST_COMPILE_S) if compiles(overrides) else first

    def _recent_seconds(self, name: str) -> list[float]:
        """The last three trials' seconds of a configuration: the machine's load now, not
        at the start (the first trial also paid the process's start-up)."""
        return [t.seconds for t in self.lab.trials[1:] if t.label == name][-3:]

    def _batch_factor(self, overrides: tuple[str, ...], relative_to: tuple[str, ...]) -> float:
        """The batch of ``overrides`` over the batch of ``relative_to`` (1.0 when unchanged)."""
        wanted = [
            int(m.group(1)) for o in overrides if (m := re.fullmatch(r"data\.batch_size=(\d+)", o))
        ]
        current = (self.checks.inspect(relative_to).config or {}).get("data", {}).get("batch_size")
        return wanted[-1] / current if wanted and isinstance(current, int) and current else 1.0

    def _reserve(self) -> float:
        """Room kept for the confirmation (its rounds of the baseline and the recipe), needed
        once the recipe has a step: a second one makes it a recipe of two."""
        return self.settings.min_rounds * 2 * self.estimate(()) if self.recipe else 0.0

    def _later_cost(self) -> float:
        """The later dimensions' minimum: what extra rounds must leave room for (two trials
        per round, a guess: their candidates are not known yet)."""
        later = len(self.settings.dimensions) - self.dimension_index - 1
        return later * self.settings.min_rounds * 2 * self.estimate(self.recipe)
