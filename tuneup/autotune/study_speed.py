"""The time-to-target study's speed stage: seconds per sample of the pick against the baseline.

Short throughput trials (``autotune.trial_steps`` steps, no validation, as the throughput
objective's: trials.trial_settings), the baseline (B) and the pick (P) interleaved, the order
reversed every round (B P, P B, ...), ``autotune.min_rounds`` to ``autotune.max_rounds`` rounds
while the interval still includes 1.0: each round one ratio of trials run next to each other
(interval.paired: Student's t over the rounds' log ratios). A trial's speed is its fastest
window, as for throughput.

Estimated time to target = mean samples to target x seconds per sample + the validations to
the target x a validation's seconds (both from the confirm trials' summaries). Its ratio to the
baseline's is the samples' paired ratio interval times the seconds-per-sample ratio interval
(paired.product_interval); a pick slower beyond that noise is refused (study_search.decide).
"""

from __future__ import annotations

import statistics

from tuneup.autotune import paired
from tuneup.autotune.interval import paired as paired_speeds
from tuneup.autotune.outcome import BASELINE
from tuneup.autotune.race import NO_TARGET, speed_settings

SPEED = "speed"


class Speed:
    def __init__(self, search, pick: dict) -> None:
        self.search, self.pick = search, pick
        self.base = search.confirmed[BASELINE]
        self.pairs: list[tuple[float, float]] = []  # (baseline, pick) samples/s, per round
        self.trials = []
        self.interval = None  # pick / baseline samples/s

    def run(self) -> Speed:
        settings, search = self.search.settings, self.search
        for number in range(settings.max_rounds):
            if number >= settings.min_rounds and self._decided():
                break
            order = [(), self.pick["overrides"]][:: -1 if number % 2 else 1]
            if search._left() < 2 * max(1.0, search._typical_seconds() / 2):
                search.notes.append(f"speed: {number} round(s), the budget ran out")
                break
            speeds = {}
            for overrides in order:
                limit = max(1.0, search._left())
                run = speed_settings(settings.trial_steps, search.batch(overrides), limit)
                trial = search.lab.run(SPEED, (*overrides, *NO_TARGET), settings=run)
                self.trials.append(trial)
                speeds[overrides] = trial.speed
            if all(speeds.values()):
                self.pairs.append((speeds[()], speeds[self.pick["overrides"]]))
        if self.pairs:
            base, pick = zip(*self.pairs, strict=True)
            self.interval = paired_speeds(list(base), list(pick), settings.confidence)
        return self

    def _decided(self) -> bool:
        base, pick = zip(*self.pairs, strict=True) if self.pairs else ((), ())
        found = paired_speeds(list(base), list(pick), self.search.settings.confidence)
        return found is not None and found.verdict != "within noise"

    # -- the figures -------------------------------------------------------------------------

    def seconds_per_sample(self, which: str) -> float | None:
        speeds = [p[0] if which == BASELINE else p[1] for p in self.pairs]
        return 1 / statistics.median(speeds) if speeds else None

    def ratio(self) -> dict | None:
        """Seconds per sample, pick / baseline, with its interval (inverse of the speeds')."""
        i = self.interval
        if i is None:
            return None
        high = None if i.low == 0 else 1 / i.low
        return {"estimate": 1 / i.estimate, "low": 1 / i.high if i.high else 0.0, "high": high,
                "rounds": i.repeats}  # fmt: skip

    def samples_ratio(self) -> dict | None:
        base = [paired_pair[0] for paired_pair in map(_figures, self.base["trials"])]
        pick = [paired_pair[0] for paired_pair in map(_figures, self.pick["trials"])]
        return paired.ratio_interval(base, pick, self.search.settings.confidence)

    def time_ratio(self) -> dict | None:
        return paired.product_interval(self.samples_ratio(), self.ratio())

    def time_verdict(self) -> str:
        found = paired.verdict_of(self.time_ratio())
        return "faster beyond the noise" if found == "faster" else found

    def estimate(self, entry: dict, which: str) -> dict | None:
        """Estimated time to target of a confirmed configuration, with its interval over the
        seeds (the samples' t interval at this seconds per sample)."""
        per_sample = self.seconds_per_sample(which)
        if per_sample is None:
            return None
        samples = [s for s, _ in map(_figures, entry["trials"])]
        validations = [t.figure("validations") or 0 for t in entry["trials"]]
        costs = [t.figure("validation_time_s") / t.figure("validations") for t in entry["trials"]
                 if t.figure("validations") and t.figure("validation_time_s") is not None]  # fmt: skip
        validation = statistics.fmean(validations) * (statistics.median(costs) if costs else 0.0)
        interval = paired.mean_interval(samples, self.search.settings.confidence, floor=0.0)
        missed = not all(ok for _, ok in map(_figures, entry["trials"]))

        def at(value):
            return None if value is None else max(0.0, value) * per_sample + validation

        return {"estimate": at(interval["estimate"]), "low": at(interval["low"]),
                "high": at(interval["high"]), "seconds_per_sample": per_sample,
                "validation_s": validation,
                "at_least": missed}  # a miss counts at the samples it ran  # fmt: skip


def _figures(trial) -> tuple[float, bool]:
    from tuneup.autotune.study_trials import seed_figure

    return seed_figure(trial)
