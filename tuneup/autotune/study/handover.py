"""The end of a sweeper's explore stage on a study that several sweepers share (leader.py):
this sweeper leads (waits for the others' running trials, then confirms and answers), or it
gives way to the leader, waiting for its answer and taking the lead over when the leader is
lost with its host (its heartbeat stale: tuneup/optuna/liveness.py) or ends without one."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

from tuneup.autotune.study.leader import (
    GAVE_WAY,
    covering,
    current_round,
    gone_in,
    leader,
    wait_for_others,
)

if TYPE_CHECKING:
    from tuneup.autotune.study.inputs import StudyInputs

log = logging.getLogger(__name__)

#: Beyond what was left above the confirmation's room, the other sweepers' trials get this long
#: to end (a job's start and end: a batch job queued, an interpreter started).
GRACE_S = 60.0
#: Seconds between two looks at the study of a sweeper that waits for the leader's answer.
POLL_S = 5.0


def lead(search: StudyInputs, clock=time.time, sleep=time.sleep) -> bool:
    """Whether this sweeper writes the study's answer (module docstring). The leader first
    waits for the other sweepers' running trials: they were started with a time limit of
    what their sweeper had left above its confirmation's room, so at most that long (this
    sweeper's, and :data:`GRACE_S`). The others wait for the leader's answer (:func:`settle`),
    then log which sweeper answers. ``clock``, ``sleep``: the wall clock and its wait."""
    from tuneup.optuna.study import recover_interrupted

    study, me = search.study, search.sweeper
    chosen, entry = settle(search, clock, sleep)
    if chosen != me:
        give_way(search, chosen, entry)
        return False
    recover_interrupted(study, keep=me, quiet=True)  # a lost sweeper's: asked again (go_on)
    bound = max(0.0, search.left() - search.reserve()) + GRACE_S
    # this round's sweepers, while they live: a sweeper lost meanwhile is not waited for
    among = lambda: set(current_round(study.user_attrs, me, gone_in(study.user_attrs)))  # noqa: E731
    left = wait_for_others(study, me, bound, among=among)
    if left:
        search.notes.append(
            f"the other sweepers' trial(s) {left} still ran {bound:.0f} s after this "
            "sweeper's explore ended: confirmed without them"
        )
    return True


def settle(search: StudyInputs, clock=time.time, sleep=time.sleep) -> tuple[str, dict]:
    """(the sweeper that answers, its entry), once known: this sweeper, or the answer that
    covers its trials. While another sweeper leads and has not answered, this one waits,
    looking every :data:`POLL_S`; a leader lost (its heartbeat stale), or that ended without
    an answer, hands the lead on to the next ticket, maybe this one. The wait ends at the
    leader's deadline (its budget's end) + :data:`STALE_S` + :data:`GRACE_S`: then this
    sweeper gives way with no answer written (its trials are in the study)."""
    from tuneup.optuna.liveness import STALE_S

    study, me, ticket = search.study, search.sweeper, search.ticket
    mine = clock() + search.left()  # this sweeper's deadline, for a leader with none recorded
    waited_for = None
    while True:
        attrs, now = study.user_attrs, clock()
        chosen, entry = leader(attrs, me, ticket, gone_in(attrs, now))
        if chosen == me or covering(attrs, ticket) is not None:
            if waited_for is not None and chosen == me:
                log.info("autotune: sweeper %s is lost or ended: this one answers", waited_for)
            return chosen, entry
        if now > (entry.get("deadline") or mine) + STALE_S + GRACE_S:
            log.warning(
                "autotune: sweeper %s (host %s) has not answered study '%s' by the end of its "
                "budget; this sweeper stops waiting",
                chosen,
                entry.get("host", "?"),
                study.study_name,
            )
            return chosen, entry
        if chosen != waited_for:
            waited_for = chosen
            log.info(
                "autotune: sweeper %s (host %s) leads study '%s': waiting for its answer "
                "(this sweeper answers if it is lost)",
                chosen,
                entry.get("host", "?"),
                study.study_name,
            )
        sleep(POLL_S)


def give_way(search: StudyInputs, chosen: str, entry: dict) -> None:
    """Another sweeper answers: named in ``answered_by.json`` and in the log."""
    study = search.study
    search.answered_by = {"sweeper": chosen, **entry}
    gave_way = Path(search.lab.sweep_dir) / GAVE_WAY
    gave_way.write_text(json.dumps({"study": study.study_name, **search.answered_by}))
    log.info(
        "autotune: sweeper %s (host %s) writes the answer of study '%s' into %s; this "
        "sweeper's trials are in its study",
        chosen,
        entry.get("host", "?"),
        study.study_name,
        entry.get("sweep_dir", "?"),
    )
