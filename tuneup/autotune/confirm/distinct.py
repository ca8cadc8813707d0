"""Which study trials are one configuration, for the confirmation (candidates.py).

TPE samples densely around what works: its best trials are often one recipe at nearly the
same values (Muon at learning rates 0.45, 0.50 and 0.53). Confirmed as three candidates, they
would split the confirmation's seeds three ways and Holm's correction would count one idea
three times, so the command could be kept where that idea wins on every seed. Two trials are
therefore one configuration when they make the same choices (every categorical axis: the
optimizer family, the scheduler, the batch size, a feature on or off) and their numbers are
close on their search scale:

- a log-scaled value within x :data:`LOG_FACTOR` of the other's;
- a linear one within :data:`LINEAR_SHARE` of its range (``high - low``).

The best trial of each such group stands for it (the trials come best first). Closeness is
taken against the group's best trial, so a chain of near neighbours does not merge values
far apart.
"""

from __future__ import annotations

from optuna.distributions import CategoricalDistribution

from tuneup.autotune.study.trials import OVERRIDES_ATTR
from tuneup.autotune.trials import label

#: Log-scaled values within this factor of each other are one configuration.
LOG_FACTOR = 1.5
#: Linear values within this share of their range are one configuration.
LINEAR_SHARE = 0.1

RULE = (
    f"the same choices, log-scaled values within x{LOG_FACTOR:g} of each other and linear ones "
    f"within {LINEAR_SHARE:.0%} of their range"
)


def close(a, b, dist) -> bool:
    """Whether two values of one axis are the same configuration on its search scale."""
    if dist is None or isinstance(dist, CategoricalDistribution):
        return a == b
    try:
        low, high = sorted((float(a), float(b)))
    except (TypeError, ValueError):
        return a == b
    if getattr(dist, "log", False):
        return low > 0 and high / low <= LOG_FACTOR
    return high - low <= LINEAR_SHARE * (dist.high - dist.low)


def same(one, other) -> bool:
    """Whether two study trials (Optuna's FrozenTrial: ``params``, ``distributions``) are one
    configuration: the same axes sampled, each value :func:`close` to the other's. Trials
    without params compare by their overrides."""
    if not one.params and not other.params:
        return overrides_of(one) == overrides_of(other)
    if one.params.keys() != other.params.keys():
        return False
    dists = {**other.distributions, **one.distributions}
    return all(close(v, other.params[k], dists.get(k)) for k, v in one.params.items())


def overrides_of(trial) -> tuple[str, ...]:
    return tuple(trial.user_attrs.get(OVERRIDES_ATTR) or ())


def distinct(trials, most: int) -> tuple[list[tuple[str, tuple[str, ...], int]], dict]:
    """The first ``most`` distinct configurations of ``trials`` (best first), each as (label,
    overrides, trial number) of its best trial, and {that number: the numbers merged into
    it}. A trial with no override (your command's own values) is no candidate."""
    kept: list = []  # the groups' best trials
    merged: dict[int, list[int]] = {}
    for trial in trials:
        if not overrides_of(trial):
            continue
        group = next((best for best in kept if same(best, trial)), None)
        if group is not None:
            merged.setdefault(group.number, []).append(trial.number)
        elif len(kept) < most:
            kept.append(trial)
    best = [(label(overrides_of(t)), overrides_of(t), t.number) for t in kept]
    return best, merged


def merged_note(best, merged: dict) -> str | None:
    """autotune.md's note on the trials merged into the confirmed candidates (None: none)."""
    parts = [
        f"`{name}` (trial {number}) stands for trial(s) {', '.join(map(str, merged[number]))}"
        for name, _, number in best
        if merged.get(number)
    ]
    if not parts:
        return None
    return f"one candidate per distinct configuration ({RULE}): " + "; ".join(parts)
