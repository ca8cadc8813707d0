"""Which of the study's trials the confirmation runs (seeds.py): the best ``autotune.confirm``
distinct configurations that reached the target.

Kept apart from running them on the paired seeds: the ranking is the study's values, or,
where the workers shared the cores and time ranks, each contender's optimizer steps at its
seconds per step timed apart (step_cost.py); one candidate per distinct configuration
(distinct.py), so the seeds and Holm's correction are not spent on one recipe twice.
"""

from __future__ import annotations

from tuneup.autotune.confirm import distinct, step_cost
from tuneup.autotune.study.trials import BASELINE_ATTR, OVERRIDES_ATTR


def _best(search) -> list[tuple[str, tuple[str, ...], int]]:
    """The study's best ``autotune.confirm`` distinct configurations that reached the
    target: (label, overrides, trial number). Where the workers shared the cores and time
    ranks, the contenders' and your command's seconds per step are timed apart first
    (confirm/step_cost.py) and the ranking uses them."""
    from optuna.trial import TrialState

    hits = [
        t
        for t in search.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if t.user_attrs.get("reached") and not t.user_attrs.get(BASELINE_ATTR)
    ]
    most = min(search.settings.confirm, search.confirm_count)  # what the budget's room holds
    if step_cost.applies(search) and hits:
        ranked = hits  # by their own times, if none can be timed apart
        contenders = _distinct(sorted(hits, key=lambda t: t.value), most * step_cost.CONTENDERS)
        measured = step_cost.measure(search, [(), *(o for _, o, _ in contenders)])
        hits = [t for t in hits if tuple(t.user_attrs.get(OVERRIDES_ATTR) or ()) in measured]
        if () in measured and hits:  # your command's and a contender's: the costs compare
            search.step_cost = measured
            search.notes.append(step_cost.rule(search))
            return _distinct(
                sorted(hits, key=lambda t: _timed_value(search, t)), most, search.notes
            )
        search.notes.append(
            "the workers shared the cores, but no seconds per step could be timed apart: "
            "each run's own were used"
        )
        return _distinct(sorted(ranked, key=lambda t: t.value), most, search.notes)
    if step_cost.rule(search):
        search.notes.append(step_cost.rule(search))
    return _distinct(sorted(hits, key=lambda t: t.value), most, search.notes)


def _distinct(
    trials, most: int, notes: list | None = None
) -> list[tuple[str, tuple[str, ...], int]]:
    """The best of each distinct configuration (distinct.py); ``notes`` hears which
    trials were merged into the candidates."""
    best, merged = distinct.distinct(trials, most)
    note = distinct.merged_note(best, merged)
    if notes is not None and note:
        notes.append(note)
    return best


def _timed_value(search, trial) -> float:
    """A study trial's time to target at its configuration's seconds per step timed apart."""
    step_s = search.step_cost[tuple(trial.user_attrs.get(OVERRIDES_ATTR) or ())]
    return (trial.user_attrs.get("steps") or 0) * step_s + (
        trial.user_attrs.get("validation_s") or 0.0
    )
