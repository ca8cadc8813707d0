"""The time-to-target study's speed stage: seconds per optimizer step of the pick against
the baseline, and the time to target they give.

Short throughput trials (``autotune.trial_steps`` steps, no validation, the user's schedule:
race.speed_settings), the baseline (B) and the pick (P) interleaved, the order reversed every
round (B P, P B, ...), ``autotune.min_rounds`` to ``autotune.max_rounds`` rounds while the
time ratio's interval still includes 1.0: each round one ratio of trials run next to each other
(interval.paired: Student's t over the rounds' log ratios). A trial's speed is its fastest
window, as for throughput; its seconds per step, its samples per step over that speed.
Where the budget holds fewer than ``autotune.min_rounds`` rounds (study/budget.py:
rounds_kept), the pairs are the paired seeds' runs instead: seed by seed, your command's run
and the pick's, from the confirmation's rounds (your command's runs on the paired seeds,
then each candidate's), so a load that changes between them weighs on the ratio, which its
interval over the seeds only partly shows: the tight budget's measure, not the rounds' (and
not where the workers shared the cores).

Estimated time to target = steps to target x seconds per step + the validations' seconds
(from the confirm trials' summaries). Its ratio to the baseline's combines the paired seeds'
steps and the rounds' seconds per step on the log scale (time_ratio.py); with
``autotune.cost=time`` a pick is adopted only when that ratio is below 1 beyond the noise
(seeds.py: decide).
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING

from tuneup.autotune.race import NO_TARGET, speed_settings
from tuneup.autotune.study.trials import samples_seen, steps_seen, validation_seconds
from tuneup.autotune.trials import BASELINE
from tuneup.stats import paired
from tuneup.stats.interval import paired as paired_speeds
from tuneup.stats.time_ratio import FASTER, NOISE, Seed, quantum, time_ratio

if TYPE_CHECKING:
    from tuneup.autotune.confirm.inputs import ConfirmInputs

SPEED = "speed"
ROUNDS, SEEDS = "rounds", "seeds"  # Speed.source


class Speed:
    def __init__(self, search: ConfirmInputs, pick: dict) -> None:
        self.search, self.pick = search, pick
        self.base = search.confirmed[BASELINE]
        self.pairs: list[tuple[float, float]] = []  # (baseline, pick) samples/s, per round
        self.trials = []
        self.interval = None  # pick / baseline samples/s
        self.batches = (search.batch(()), search.batch(pick["overrides"]))  # samples per step
        self.source = ROUNDS  # where the pairs come from: the rounds, or the paired seeds' runs

    def run(self) -> Speed:
        settings, search = self.search.settings, self.search
        for number in range(settings.max_rounds):
            if number >= settings.min_rounds and self._decided():
                break
            order = [(), self.pick["overrides"]][:: -1 if number % 2 else 1]
            if search.left() < 2 * max(1.0, search.typical_seconds() / 2):
                search.notes.append(f"speed: {number} round(s), the budget ran out")
                break
            speeds = {}
            for overrides in order:
                limit = max(1.0, search.left())
                run = speed_settings(settings.trial_steps, search.batch(overrides), limit)
                trial = search.lab.run(SPEED, (*overrides, *NO_TARGET), settings=run)
                self.trials.append(trial)
                speeds[overrides] = trial.speed
            if all(speeds.values()):
                self.pairs.append((speeds[()], speeds[self.pick["overrides"]]))
        if len(self.pairs) < settings.min_rounds:
            self._from_seeds()
        if self.pairs:
            base, pick = zip(*self.pairs, strict=True)
            self.interval = paired_speeds(list(base), list(pick), settings.confidence)
        return self

    def _from_seeds(self) -> None:
        """Fewer than ``autotune.min_rounds`` rounds fit in the budget: the pick's and your
        command's speeds come from their runs on the paired seeds instead, one pair per seed
        (module docstring). Not where the workers shared the cores: a run's own speed then
        measured the others' load too."""
        if self.search.workers.shared_cores:
            return
        pairs = [
            (b.speed, p.speed)
            for b, p in zip(self.base["trials"], self.pick["trials"], strict=False)
            if b.speed and p.speed
        ]
        if len(pairs) < 2:
            return
        self.search.notes.append(
            f"speed: {len(self.pairs)} interleaved round(s) fit in the budget: the seconds "
            f"per step are from the {len(pairs)} paired seeds' runs (your command's and the "
            "pick's on each seed, run in the confirmation's order)"
        )
        self.pairs, self.source = pairs, SEEDS

    def _decided(self) -> bool:
        """Whether the time to target (the ratio that is reported and decides) is decided."""
        return (self.time_ratio() or {}).get("verdict", NOISE) != NOISE

    # -- the figures -------------------------------------------------------------------------

    def step_seconds(self) -> list[tuple[float, float]]:
        """(baseline, pick) seconds per optimizer step of each round."""
        return [(self.batches[0] / b, self.batches[1] / p) for b, p in self.pairs]

    def seconds_per_step(self, which: str) -> float | None:
        rounds = [b if which == BASELINE else p for b, p in self.step_seconds()]
        return statistics.median(rounds) if rounds else None

    def ratio(self) -> dict | None:
        """Seconds per step, pick / baseline, with its interval over the rounds."""
        if not self.pairs:
            return None
        base, pick = zip(*self.step_seconds(), strict=True)
        i = paired_speeds(list(base), list(pick), self.search.settings.confidence)
        return {
            "estimate": i.estimate,
            "low": i.low if i.repeats > 1 else None,
            "high": i.high if i.repeats > 1 else None,
            "rounds": i.repeats,
        }

    def count_ratio(self, count) -> dict | None:
        """Steps (``steps_seen``) or samples (``samples_seen``) to target, pick / baseline,
        over the paired seeds (shown beside the time)."""
        base, pick = ([count(t) for t in e["trials"]] for e in (self.base, self.pick))
        return paired.ratio_interval(base, pick, self.search.settings.confidence)

    def samples_ratio(self) -> dict | None:
        return self.count_ratio(samples_seen)

    def steps_ratio(self) -> dict | None:
        return self.count_ratio(steps_seen)

    def time_ratio(self) -> dict | None:
        """Time to target, pick / baseline: the seeds' steps and validations and the rounds'
        seconds per step on the log scale (time_ratio.py)."""
        pick = seeds(self.pick)
        # the command ran every seed a candidate ran (seeds are added while one is undecided):
        # the pick's seeds are the command's first ones
        return time_ratio(
            seeds(self.base)[: len(pick)],
            pick,
            self.step_seconds(),
            self.search.settings.confidence,
        )

    def time_verdict(self) -> str:
        found = (self.time_ratio() or {}).get("verdict") or "not measured"
        return "faster beyond the noise" if found == FASTER else found

    def estimate(self, entry: dict, which: str) -> dict | None:
        """Estimated time to target of a confirmed configuration, with its interval over the
        seeds (the steps' t interval at this seconds per step) + its validations' seconds."""
        per_step = self.seconds_per_step(which)
        if per_step is None:
            return None
        steps = [steps_seen(t) for t in entry["trials"]]
        validation = statistics.fmean(validation_seconds(t) for t in entry["trials"])
        interval = paired.mean_interval(steps, self.search.settings.confidence, floor=0.0)
        missed = not all((t.figure("target") or {}).get("reached") for t in entry["trials"])

        def at(value):
            return None if value is None else max(0.0, value) * per_step + validation

        return {
            "estimate": at(interval["estimate"]),
            "low": at(interval["low"]),
            "high": at(interval["high"]),
            "seconds_per_step": per_step,
            "validation_s": validation,
            "at_least": missed,
        }  # a miss counts at the steps it ran


def seeds(entry: dict) -> list[Seed]:
    """A confirmed configuration's runs on the paired seeds, as time_ratio takes them."""
    return [
        Seed(steps_seen(t), validation_seconds(t), quantum(t.figure("target_history") or []))
        for t in entry["trials"]
    ]
