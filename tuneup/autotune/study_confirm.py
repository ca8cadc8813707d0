"""The time-to-target study's confirm stage and its decision (study_search.py's stages 3, 4).

The best ``autotune.confirm`` configurations of the study and the user's command run on the
same ``autotune.seeds`` seeds the study never saw; a candidate is accepted only when its
per-seed differences in samples to target from the command's have a t interval below 0
(paired.py). The pick is then timed against the command (study_speed.py).
"""

from __future__ import annotations

import math

from tuneup.autotune import paired
from tuneup.autotune.outcome import BASELINE, label
from tuneup.autotune.study_advice import search_no_answer
from tuneup.autotune.study_trials import BASELINE_ATTR, OVERRIDES_ATTR, seed_figure


def confirm(search) -> None:
    """The baseline and the best configurations on the paired seeds."""
    from optuna.trial import TrialState

    best, seen = [], set()
    hits = [t for t in search.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if t.user_attrs.get("reached") and not t.user_attrs.get(BASELINE_ATTR)]  # fmt: skip
    for trial in sorted(hits, key=lambda t: t.value):
        overrides = tuple(trial.user_attrs.get(OVERRIDES_ATTR) or ())
        if overrides and overrides not in seen and len(best) < search.settings.confirm:
            seen.add(overrides)
            best.append((overrides, trial.number))
    if not best:
        search.notes.append("no study trial reached the target: nothing to confirm")
        return
    for overrides, number in [((), None), *best]:
        name = label(overrides)
        cost = search._confirm_seconds() * len(search.confirm_seeds)
        if search._left() - search._speed_reserve() < cost:
            search.notes.append(f"`{name}` (trial {number}) not confirmed: the budget ran out")
            if not overrides:
                return  # without the baseline on the paired seeds nothing can be decided
            continue
        # the baseline within your own limits (its true samples to target on each seed);
        # a candidate within the baseline's most x autotune.race_margin
        samples = _confirm_samples(search) if overrides else None
        runs = [search.race_run(name, overrides, seed, samples=samples,
                              limit_s=max(1.0, search._left() - search._speed_reserve()))
                for seed in search.confirm_seeds]  # fmt: skip
        search.confirmed[name] = {"overrides": overrides, "trial": number, "trials": runs,
                                "samples_budget": samples}  # fmt: skip
    if BASELINE not in search.confirmed:
        return
    base = [seed_figure(t) for t in search.confirmed[BASELINE]["trials"]]
    for name, entry in search.confirmed.items():
        if name != BASELINE:
            entry["decision"] = paired.paired_gain(
                base, [seed_figure(t) for t in entry["trials"]], search.settings.confidence
            )


def _confirm_samples(search) -> int:
    """A candidate's budget on the paired seeds: the baseline's most samples to target
    there x autotune.race_margin (at least the study's trial budget)."""
    base = [s for s, ok in map(seed_figure, search.confirmed[BASELINE]["trials"]) if ok]
    most = math.ceil(max(base) * search.settings.race_margin) if base else 0
    return max(most, search.baseline["trial_samples"])


def decide(search) -> None:
    """The pick (paired seeds), then its speed against the baseline's (study_speed.py)."""
    from tuneup.autotune.study_speed import Speed

    decisions = {n: e["decision"] for n, e in search.confirmed.items() if n != BASELINE}
    means = {n: sum(s for s, _ in map(seed_figure, e["trials"])) / len(e["trials"])
             for n, e in search.confirmed.items()}  # fmt: skip
    chosen = paired.pick(decisions, means)
    if not decisions:  # the advice follows from what happened (study_advice.py)
        search.verdict = search_no_answer(search)
        return
    if chosen is None:
        search.verdict = ("not significant: no configuration needed fewer samples to the target "
                        "than your command in every paired seed beyond the noise; your "
                        "command is kept")  # fmt: skip
        return
    pick = search.confirmed[chosen]
    search.speed = Speed(search, pick).run()
    time_verdict = search.speed.time_verdict()
    if time_verdict == "slower":
        search.verdict = (f"`{chosen}` needs fewer samples, but is slower to the target in "
                        "estimated time (paired throughput windows): your command is kept")  # fmt: skip
        return
    search.recipe = pick["overrides"]
    search.verdict = (f"`{chosen}` needs fewer samples to the target in every paired seed "
                    f"beyond the noise; estimated time to target: {time_verdict}")  # fmt: skip
