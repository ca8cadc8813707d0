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
from tuneup.autotune.study_trials import (
    BASELINE_ATTR,
    OVERRIDES_ATTR,
    SAMPLES,
    TIME,
    UNITS,
    seed_figure,
)


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
    cost = search.settings.cost
    base = [seed_figure(t, cost) for t in search.confirmed[BASELINE]["trials"]]
    for name, entry in search.confirmed.items():
        if name != BASELINE:
            entry["decision"] = paired.paired_gain(
                base, [seed_figure(t, cost) for t in entry["trials"]], search.settings.confidence
            )


def _confirm_samples(search) -> int:
    """A candidate's budget on the paired seeds: the baseline's most samples to target
    there x autotune.race_margin (at least the study's trial budget)."""
    base = [seed_figure(t, SAMPLES) for t in search.confirmed[BASELINE]["trials"]]
    base = [s for s, ok in base if ok]
    most = math.ceil(max(base) * search.settings.race_margin) if base else 0
    return max(most, search.baseline["trial_samples"])


def decide(search) -> None:
    """The pick (paired seeds, on ``autotune.cost``), then its time to target against the
    baseline's (study_speed.py). With ``autotune.cost=time`` the pick is adopted only when
    that time is lower than the command's beyond the noise; with ``steps`` or ``samples`` the
    paired decision on that count decides and the time on this machine is information."""
    from tuneup.autotune.study_speed import Speed

    cost = search.settings.cost
    decisions = {n: e["decision"] for n, e in search.confirmed.items() if n != BASELINE}
    means = {n: sum(seed_figure(t, cost)[0] for t in e["trials"]) / len(e["trials"])
             for n, e in search.confirmed.items()}  # fmt: skip
    chosen = paired.pick(decisions, means)
    less = "time" if cost == TIME else f"{UNITS[cost]}"
    if not decisions:
        search.verdict = ("nothing confirmed on paired seeds (see the notes): your command is "
                          "kept; raise autotune.budget_minutes or autotune.budget_trials")  # fmt: skip
        return
    if chosen is None:
        search.verdict = (f"not significant: no configuration needed less {less} to the target "
                          "than your command in every paired seed beyond the noise; your "
                          "command is kept")  # fmt: skip
        return
    pick = search.confirmed[chosen]
    search.speed = Speed(search, pick).run()
    found = search.speed.time_ratio()
    time = f"estimated time to target {ratio_text(found)} your command's"
    if cost == TIME and (found or {}).get("verdict") != "faster":
        search.verdict = (f"`{chosen}` needed less time on the paired seeds, but its {time} "
                          f"({search.speed.time_verdict()}): not lower beyond the noise, so "
                          "your command is kept")  # fmt: skip
        return
    search.recipe = pick["overrides"]
    if cost == TIME:
        search.verdict = f"`{chosen}` reaches the target sooner: {time}, faster beyond the noise"
        return
    search.verdict = (f"`{chosen}` needs fewer {UNITS[cost]} to the target in every paired seed "
                      f"beyond the noise (autotune.cost={cost}); on this machine, {time}: "
                      f"{search.speed.time_verdict()}")  # fmt: skip


def ratio_text(found: dict | None) -> str:
    """A time ratio as ``0.64x [0.51, 0.8]`` (``not measured`` without rounds)."""
    if not found:
        return "not measured"
    if found.get("low") is None:
        return f"{found['estimate']:.3g}x"
    return f"{found['estimate']:.3g}x [{found['low']:.3g}, {found['high']:.3g}]"
