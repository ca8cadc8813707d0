"""``autotune.objective=time_to_target``: the recipe that reaches the user's target first.

::

    baseline                the user's command, trained to its target (target.stop=true) in
                            each of autotune.seeds seeds (seed, seed+1, ...): the recipe so far
    for each dimension      autotune.race_dimensions, in order (batch_size: batch.py, its
                            memory probes and learning-rate rule; the others: autotune.space)
        never launched      candidates the checks refuse, that change nothing here or that
                            their checks predict to lose (space.py), as for throughput
        trained             each candidate on top of the recipe so far, seed after seed, to
                            the target or to its budget: the user's trainer.max_steps /
                            max_epochs, and a time limit (trainer.max_time) of the best
                            configuration's slowest seed x autotune.race_margin, so a loser
                            stops once it is slower than the best could be; a seed that does
                            not reach the target ends the candidate (its later seeds are not run)
        accepted            the candidate that reached the target in every seed with the
                            lowest mean time, when lower than the recipe's; it joins the recipe

A candidate that did not reach the target in a seed counts as not reached and ranks after
every one that did. The time to target is summary.json's ``time_to_target_s`` (training and
validation from the first step, plugins/target/); its interval is Student's t over the seeds
(convergence varies by seed; two seeds give a wide interval, honestly). Unlike throughput,
no loss-curve guard applies: changing the curve is the point; the target is the guard.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from tuneup import TuneupError
from tuneup.autotune.interval import t_quantile
from tuneup.autotune.outcome import ACCEPTED, BASELINE, NOT_TRIED, REJECTED, Outcome, label
from tuneup.autotune.search import Search
from tuneup.autotune.settings import BATCH
from tuneup.autotune.space import Candidate
from tuneup.autotune.trials import Trial, max_time

TIME_TO_TARGET = "time_to_target"
NO_TARGET = ("target.metric=null", "target.value=null")


def race_settings(limit_s: float | None = None) -> list[str]:
    """What makes a run a race trial: it stops at its target, writes no checkpoints, prints
    one line, and stops at ``limit_s`` seconds (counted as not reached)."""
    found = [
        "target.stop=true",
        "checkpoint=off",
        "trainer.enable_progress_bar=false",
        "measure.console_table=false",
    ]
    return found + ([max_time(limit_s)] if limit_s is not None else [])


def required_target(checks) -> dict:
    """The user's composed config, which a time-to-target search needs a target in: one that
    has none is refused before any trial."""
    config = checks.inspect(()).config
    target = (config or {}).get("target") or {}
    if not target.get("metric") or target.get("value") is None:
        raise TuneupError(
            "autotune.objective=time_to_target needs a target: add e.g. "
            "target.metric=val/acc target.value=0.9 (and target.check_every_n_steps=...)"
        )
    return config


def reached(trial: Trial) -> bool:
    return trial.ok and bool((trial.figure("target") or {}).get("reached"))


@dataclass
class Entry:
    """One configuration's race: its trials, one per seed (fewer when a seed missed)."""

    overrides: tuple[str, ...]
    seeds: int
    trials: list[Trial] = field(default_factory=list)
    limit_s: float | None = None

    @property
    def reached(self) -> bool:
        return len(self.trials) == self.seeds and all(reached(t) for t in self.trials)

    def figures(self, key: str) -> list[float]:
        return [t.figure(key) for t in self.trials if reached(t) and t.figure(key) is not None]

    @property
    def mean(self) -> float:
        return statistics.fmean(self.figures("time_to_target_s")) if self.reached else math.inf

    @property
    def slowest(self) -> float:
        return max(self.figures("time_to_target_s")) if self.reached else math.inf

    def missed(self) -> str:
        """Why it counts as not reached."""
        last = self.trials[-1]
        seed = next((o for o in last.overrides if o.startswith("seed=")), "a seed")
        if not last.ok:
            return f"its trial failed in {seed} (job {last.job}): {last.error}"
        best = (last.figure("target") or {}).get("best")
        stop = f"the time limit {self.limit_s:.3g} s (the best so far x autotune.race_margin)"
        why = stop if self.limit_s is not None else "its budget (your trainer.max_steps/epochs)"
        return f"did not reach the target in {seed} (best {best}; stopped at {why}, job {last.job})"

    def as_dict(self, confidence: float) -> dict:
        times = self.figures("time_to_target_s")
        found = {"reached": self.reached, "seeds": self.seeds, "runs": len(self.trials),
                 "jobs": [t.job for t in self.trials], "time_limit_s": self.limit_s,
                 "time_to_target_s": times}  # fmt: skip
        found["interval"] = time_interval(times, confidence) if self.reached else None
        for key in ("time_to_target_train_s", "steps_to_target", "samples_to_target"):
            values = self.figures(key)
            found[key] = statistics.median(values) if self.reached and values else None
        return found


def time_interval(times: list[float], confidence: float) -> dict | None:
    """Mean time to target and its Student's t interval over the seeds."""
    if len(times) < 2:
        return None
    mean = statistics.fmean(times)
    half = t_quantile(confidence, len(times) - 1) * statistics.stdev(times) / math.sqrt(len(times))
    return {"estimate": mean, "low": max(0.0, mean - half), "high": mean + half,
            "seeds": len(times), "confidence": confidence}  # fmt: skip


class Probes:
    """The lab as batch.py's memory probes see it: short trials without validation, so
    without the target (the target plugin needs validation)."""

    def __init__(self, lab) -> None:
        self.lab = lab

    @property
    def trials(self) -> list[Trial]:
        return self.lab.trials

    def run(self, label, overrides, steps=None, limit_s=None) -> Trial:
        return self.lab.run(label, (*overrides, *NO_TARGET), steps, limit_s)


class RaceSearch(Search):
    """The search for ``autotune.objective=time_to_target`` (the module docstring)."""

    def __init__(self, settings, lab, checks, budget, seed: int) -> None:
        super().__init__(settings, lab, checks, budget)
        self.seeds = [seed + i for i in range(settings.seeds)]
        self.entries: dict[str, Entry] = {}  # label -> its race
        self.best: Entry | None = None  # the recipe so far's race

    def run(self) -> RaceSearch:
        required_target(self.checks)
        self.best = self.race((), limit=False)
        self.baseline = self.best.trials[0]
        if not self.best.reached:
            raise TuneupError(
                f"the baseline (your command as it is) {self.best.missed()}; see "
                f"{self.baseline.directory}; the race needs a command that reaches its target "
                "(lower target.value or train longer)"
            )
        self.walk(self.settings.race_dimensions, lambda: sum(t.seconds for t in self.best.trials))
        return self

    def candidates(self, dimension: str) -> list[Candidate]:
        """As the search's; the batch size's probes run as probes (:class:`Probes`)."""
        if dimension != BATCH:
            return super().candidates(dimension)
        lab, self.lab = self.lab, Probes(self.lab)
        try:
            return super().candidates(dimension)
        finally:
            self.lab = lab

    def race(self, overrides: tuple[str, ...], limit: bool = True) -> Entry:
        """``overrides`` trained to the target, seed after seed, until a seed misses."""
        limit_s = self.best.slowest * self.settings.race_margin if limit and self.best else None
        entry = Entry(overrides, len(self.seeds), limit_s=limit_s)
        for seed in self.seeds:
            settings = race_settings(limit_s)
            trial = self.lab.run(label(overrides), (*overrides, f"seed={seed}"), settings=settings)
            entry.trials.append(trial)
            if not reached(trial):
                break
        self.entries[label(overrides)] = entry
        return entry

    def decide(self, candidates: list[Candidate]) -> None:
        """Each candidate raced on top of the recipe; the fastest to the target joins it."""
        against, recipe = label(self.recipe), self.best
        raced = []
        for candidate in candidates:
            if not self.budget.allows(sum(t.seconds for t in recipe.trials)):
                self.outcomes.append(Outcome(candidate.dimension, candidate.overrides, against,
                                             NOT_TRIED, "the budget ran out before it"))  # fmt: skip
                continue
            entry = self.race(self.recipe + candidate.overrides)
            raced.append((candidate, entry))
            if entry.reached and entry.slowest < self.best.slowest:
                self.best = entry  # later candidates' time limit: this one's
        winner = min(raced, key=lambda pair: pair[1].mean, default=None)
        for candidate, entry in raced:
            outcome = Outcome(candidate.dimension, candidate.overrides, against, REJECTED,
                              trials=entry.trials)  # fmt: skip
            if not entry.reached:
                outcome.reason = entry.missed()
            elif entry.mean >= recipe.mean:
                outcome.reason = (
                    f"slower to the target: {_seconds(entry)} against {_seconds(recipe)}"
                )
            elif entry is not winner[1]:
                outcome.reason = f"faster, but `{label(winner[1].overrides)}` is more so"
            else:
                outcome.verdict = ACCEPTED
                outcome.reason = (
                    f"faster to the target: {_seconds(entry)} against {_seconds(recipe)}"
                )
            self.outcomes.append(outcome)
        if winner and winner[1].reached and winner[1].mean < recipe.mean:
            self.recipe, self.best = winner[1].overrides, winner[1]
        else:
            self.best = recipe

    def recipe_entry(self) -> Entry:
        return self.entries[label(self.recipe)]

    def rank(self) -> list[Entry]:
        """Every configuration raced: those that reached, fastest first, then the others."""
        return sorted(self.entries.values(), key=lambda e: (not e.reached, e.mean))


def _seconds(entry: Entry) -> str:
    times = entry.figures("time_to_target_s")
    return (
        f"mean {entry.mean:.3g} s over {len(times)} seeds ({', '.join(f'{t:.3g}' for t in times)})"
    )


__all__ = ["BASELINE", "TIME_TO_TARGET", "Entry", "RaceSearch", "race_settings"]
