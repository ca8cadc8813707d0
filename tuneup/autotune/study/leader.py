"""Several sweepers on one study (the same ``autotune.storage`` and ``autotune.study_name``):
one budget, and one of them writes the answer.

Nothing here needs a compare-and-set in the storage. What every Optuna storage gives out
atomically is a trial's number; the rules stand on it:

- **The budget.** ``autotune.budget_trials`` is the study's first trials by number: a trial
  counts unless it is the baseline's or was interrupted (a killed trial, its retry counting
  instead). A sweeper that has just asked trial ``n`` runs it only when fewer than
  ``budget_trials`` counting trials have a lower number (:func:`over_budget`); else the trial
  is told failed and interrupted (it counts nowhere) and that sweeper stops asking. Two
  sweepers that ask at once for the last place therefore never both run a trial for it.
- **The leader.** Each sweeper's ticket is the number of the first trial it asked; it is kept
  in the study's user attributes (``tuneup_sweeper:<host:pid>``, with its sweep directory).
  At the end of its explore stage each sweeper finds the leader (:func:`leader`): the
  sweeper with the lowest ticket among those of the study's current round (tickets above
  the last answer's trials) that have not ended with an error and are not known to be
  gone (a dead process on this host, a heartbeat stale or ended on another:
  tuneup/optuna/liveness.py). The leader waits for the running trials of the round's
  other sweepers, at most ``bound_s`` (:func:`wait_for_others`), then confirms and
  writes the answer, and records which trials it covers (``tuneup_answered``). The others
  wait for that answer, taking the lead over if the leader is lost (handover.py), and
  end with a line naming the leader's host and sweep directory. A sweeper whose own
  trials an answer covers already gives way to that answer, as does one that asked no
  trial (the budget was spent) of a study whose answer is written; one that asked none and finds no leader and no answer
  answers itself, as a continued study does. A sweeper that gives way writes
  ``answered_by.json`` into its sweep directory (its sweep report then has no runs to show).
"""

from __future__ import annotations

import logging
import math
import socket
import time
from typing import TYPE_CHECKING

from tuneup.autotune.study.trials import BASELINE_ATTR

if TYPE_CHECKING:
    from tuneup.autotune.study.inputs import StudyInputs

log = logging.getLogger(__name__)

ENTRY = "tuneup_sweeper:"  # + host:pid: {"ticket", "host", "sweep_dir", "deadline"[, "ended"]}
ANSWERED = "tuneup_answered"  # {"by", "host", "sweep_dir", "through"}
OVER_BUDGET_ATTR = "tuneup_over_budget"
#: In the sweep directory of a sweeper that gives way: which sweeper writes the answer, where.
GAVE_WAY = "answered_by.json"


def counts(trial) -> bool:
    """Whether a trial takes a place in ``budget_trials``: not the baseline's, not interrupted
    (asked over the budget, or killed: its retry counts)."""
    from optuna.trial import TrialState

    from tuneup.optuna.study import INTERRUPTED_ATTR

    attrs = trial.user_attrs
    if attrs.get(BASELINE_ATTR):
        return False
    return not (trial.state == TrialState.FAIL and attrs.get(INTERRUPTED_ATTR))


def taken(study) -> int:
    """Places of the budget taken: trials finished or running, by every sweeper (the waiting
    ones, retries, are asked first and are counted when they are)."""
    from optuna.trial import TrialState

    return sum(
        1 for t in study.get_trials(deepcopy=False) if t.state != TrialState.WAITING and counts(t)
    )


def over_budget(study, number: int, budget: int) -> bool:
    """Whether trial ``number`` is past the budget: ``budget`` counting trials come before it."""
    before = [t for t in study.get_trials(deepcopy=False) if t.number < number and counts(t)]
    return len(before) >= budget


def refuse(study, trial) -> None:
    """A trial asked past the budget: told failed and interrupted, so it counts nowhere."""
    from optuna.trial import TrialState

    from tuneup.optuna.study import INTERRUPTED_ATTR

    trial.set_user_attr(OVER_BUDGET_ATTR, True)
    trial.set_user_attr(INTERRUPTED_ATTR, True)
    study.tell(trial, state=TrialState.FAIL)


def register(study, me: str, ticket: int, sweep_dir: str, deadline: float) -> None:
    """This sweeper's ticket: the number of its first trial; ``deadline``: when its budget
    ends (wall clock), which bounds how long the others wait for its answer."""
    entry = {"ticket": ticket, "host": socket.gethostname(), "sweep_dir": sweep_dir}
    study.set_user_attr(ENTRY + me, {**entry, "deadline": deadline})


def ended(study, me: str) -> None:
    """This sweeper stopped with an error: it cannot lead."""
    entry = study.user_attrs.get(ENTRY + me)
    if entry is not None:
        study.set_user_attr(ENTRY + me, {**entry, "ended": True})


def answered(study, me: str, sweep_dir: str) -> None:
    """The answer written by ``me`` covers every trial the study has now."""
    through = max((t.number for t in study.get_trials(deepcopy=False)), default=-1)
    study.set_user_attr(
        ANSWERED,
        {"by": me, "host": socket.gethostname(), "sweep_dir": sweep_dir, "through": through},
    )


def leader(attrs: dict, me: str, ticket: int | None, gone) -> tuple[str, dict]:
    """(the sweeper that writes the answer, what is known of it: host, sweep_dir), from the
    study's user attributes ``attrs``; ``gone(id)``: whether a sweeper is known dead."""
    answer = covering(attrs, ticket)
    if answer is not None:
        return answer["by"], answer
    candidates = current_round(attrs, me, gone)
    candidates.setdefault(me, {"ticket": math.inf if ticket is None else ticket})
    chosen = min(candidates, key=lambda k: (candidates[k]["ticket"], k))
    return chosen, candidates[chosen]


def covering(attrs: dict, ticket: int | None) -> dict | None:
    """The study's answer when it covers this sweeper's trials (``ticket``: its first), or,
    for a sweeper that asked none, when no sweeper has asked a trial since."""
    answer = attrs.get(ANSWERED)
    if answer is None:
        return None
    if ticket is not None:
        return answer if ticket <= answer["through"] else None
    return None if _later(attrs, answer["through"]) else answer


def gone_in(attrs: dict, now: float | None = None):
    """``gone(id)`` for :func:`leader`: a sweeper's process dead on this host, its heartbeat
    stale or ended on another (tuneup/optuna/liveness.py), as of ``now``."""
    from tuneup.optuna.liveness import is_gone

    return lambda owner: is_gone(owner, attrs, now)


def current_round(attrs: dict, me: str, gone) -> dict[str, dict]:
    """The sweepers of the study's current round (tickets after the last answer's trials)
    that may still answer: not ended with an error, not known to be gone."""
    answer = attrs.get(ANSWERED)
    through = answer["through"] if answer else -1
    return {
        key[len(ENTRY) :]: entry
        for key, entry in attrs.items()
        if key.startswith(ENTRY)
        and entry["ticket"] > through
        and not entry.get("ended")
        and (key[len(ENTRY) :] == me or not gone(key[len(ENTRY) :]))
    }


def _later(attrs: dict, through: int) -> bool:
    """Whether a sweeper has tickets after the last answer's trials (a new round)."""
    return any(
        key.startswith(ENTRY) and entry["ticket"] > through and not entry.get("ended")
        for key, entry in attrs.items()
    )


def others_running(study, me: str, among=None) -> list[int]:
    """The numbers of the study's running trials that other sweepers asked (those of
    ``among``, when given)."""
    from optuna.trial import TrialState

    from tuneup.optuna.study import SWEEPER_ATTR

    running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    owners = [(t.number, t.user_attrs.get(SWEEPER_ATTR)) for t in running]
    return [n for n, o in owners if o != me and (among is None or o in among)]


def wait_for_others(study, me: str, bound_s: float, poll_s: float = 2.0, among=None) -> list[int]:
    """Wait until no other sweeper's trial is running (of the sweepers ``among``, when
    given, a set or a function giving it at each look: a trial left RUNNING by a sweeper
    lost on another host is not waited for), at most ``bound_s``; the trials still running
    then (the answer is made without them)."""
    deadline = time.monotonic() + max(0.0, bound_s)

    def running() -> list[int]:
        return others_running(study, me, among() if callable(among) else among)

    left = running()
    if left:
        log.info("autotune: waiting for the other sweepers' trial(s) %s", left)
    while left and time.monotonic() < deadline:
        time.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))
        left = running()
    return left


def draw_apart(search: StudyInputs, ticket: int) -> None:
    """A sweeper whose first trial is not the study's first (another sweeper's, or an earlier
    sweep's, come before it) draws from its own seed: the seed + that trial's number. Two
    sweepers started from one command would otherwise draw the same values, as would a
    continued study its first ones again."""
    from dataclasses import replace

    from tuneup.autotune.study.sampler import study_sampler

    earlier = [
        t
        for t in search.study.get_trials(deepcopy=False)
        if t.number < ticket and not t.user_attrs.get(BASELINE_ATTR)
    ]
    if not earlier:
        return
    settings = search.settings
    base = search.seed if settings.sampler_seed is None else settings.sampler_seed
    own = replace(settings, sampler_seed=base + ticket)
    search.study.sampler = study_sampler(own, base + ticket, search.workers.count)
