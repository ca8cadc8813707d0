"""The time-to-target study's explore stage (time_to_target.py): its trials asked, launched and
told, up to ``autotune.workers`` at once, by the Optuna sweepers' driver
(tuneup/optuna/workers.py :func:`run_trials`): a worker asks the next trial as soon as its
own ends, with no batch waiting for its slowest trial.

``autotune.budget_trials`` counts the study's trials over all workers, and over every sweeper
on the study (study/leader.py: the study's first trials by number);
``autotune.budget_samples`` and ``autotune.budget_minutes`` stop the asking (the running
trials are waited for and told); a trial's time limit is what is left above the
confirmation's room when it starts, so no trial starts that could not finish in it.

A trial whose process is killed (SIGKILL, a lost node) ends without its summary.json (the
launcher raises; trials.was_killed): it is marked failed and interrupted (it does not count towards the budget), and
its parameters are asked again, once; the other workers go on.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from tuneup.autotune.race import reached
from tuneup.autotune.study import budget as study_budget
from tuneup.autotune.study import leader as study_leader
from tuneup.autotune.study.trials import (
    BASELINE_ATTR,
    JOB_ATTR,
    NEVER_ATTR,
    OVERRIDES_ATTR,
    config_value,
    console_line,
    figures,
    relative_gap,
    samples_seen,
    trial_value,
)
from tuneup.autotune.trials import Trial, label

if TYPE_CHECKING:
    from tuneup.autotune.study.inputs import StudyInputs

log = logging.getLogger(__name__)

#: The worker's share of the machine the trial ran with ("1 thread(s)", "GPU 1")
WORKER_ATTR = "tuneup_worker"


def explore(search: StudyInputs) -> None:
    """Run the study's trials until the budget is spent (module docstring)."""
    from tuneup.optuna import study as studies
    from tuneup.optuna.workers import Slots, run_trials

    others = len(studies.finished(search.study)) - len(search.explored())  # the baseline's
    slots = Slots(search.workers.count)

    def launch(number: int, job: dict) -> Trial:
        with slots.take() as slot:
            return search.race_run(
                job["label"],
                job["overrides"],
                search.seed,
                samples=search.baseline["trial_samples"],
                limit_s=job["limit_s"],
                extra=job["extra"],
                worker=search.workers.resources(slot),
            )

    run_trials(
        search.study,
        workers=search.workers.count,
        n_trials=search.settings.budget_trials + others,
        ask=lambda: ask(search),
        launch=launch,
        tell=lambda trial, run: tell(search, trial, run),
        max_failure_rate=1.0,  # a failed trial is a finding (a candidate that crashes)
    )


def go_on(search: StudyInputs) -> None:
    """Once the answer is given: the minutes it left (a confirmation decided in fewer seeds
    than its room, no pick to run on the held-out seed and to time) go to the study while it
    has trials left (study_budget.goes_on). Those trials are the study's, for a continued
    search on the same storage; the answer stays the one given: confirming another
    candidate now would test again at the level the confirmation has spent."""
    left = search.settings.budget_trials - study_leader.taken(search.study)
    if not study_budget.goes_on(search.left(), search.typical_seconds(), left):
        return
    search.answered = True
    before, minutes = len(search.explored()), search.left() / 60
    explore(search)
    search.notes.append(
        f"the answer left {minutes:.2g} of the {search.settings.budget_minutes:g} minute(s) "
        f"of autotune.budget_minutes: the study went on with them, "
        f"{len(search.explored()) - before} more trial(s), kept in the study for a continued "
        "search (not confirmed)"
    )


def ask(search: StudyInputs):
    """The next trial and its job, ``(trial, None)`` for one the checks refuse (told failed
    here), or None once ``budget_samples`` or ``budget_minutes`` stop the study."""
    from optuna.trial import TrialState

    from tuneup.optuna import study as studies

    done = search.explored()
    used = sum(t.user_attrs.get("samples_seen") or 0 for t in done)
    if search.settings.budget_samples is not None and used >= search.settings.budget_samples:
        search.notes.append(f"explore stopped at autotune.budget_samples: {used:,} samples")
        return None
    limit = study_budget.explore_limit(search.left(), search.reserve(), search.typical_seconds())
    if not limit:
        rest = "" if search.answered else ": the rest is kept for confirm and speed"
        search.notes.append(
            f"explore stopped by autotune.budget_minutes after {len(done)} trial(s){rest}"
        )
        return None
    # the trials of another sweeper lost meanwhile (its host): failed, their values asked next
    studies.recover_interrupted(search.study, keep=search.sweeper, quiet=True)
    budget = search.settings.budget_trials
    if study_leader.taken(search.study) >= budget:  # places taken by every sweeper
        search.notes.append(f"explore stopped: the study has its {budget} trial(s)")
        return None
    trial = search.study.ask()
    trial.set_user_attr(studies.SWEEPER_ATTR, search.sweeper)
    if study_leader.over_budget(search.study, trial.number, budget):  # another sweeper's
        study_leader.refuse(search.study, trial)  # asked at once took the last place
        search.notes.append(f"explore stopped: the study has its {budget} trial(s)")
        return None
    if search.ticket is None:
        search.ticket = trial.number
        deadline = time.time() + search.left()  # how long the others wait for its answer
        study_leader.register(
            search.study, search.sweeper, trial.number, str(search.lab.sweep_dir), deadline
        )
        study_leader.draw_apart(search, trial.number)
    values = search.space.sample(trial)
    overrides = search.space.overrides(
        {k: v for k, v in values.items() if config_value(search.user_config, k) != v}
    )
    trial.set_user_attr(OVERRIDES_ATTR, list(overrides))
    inspection = search.checks.inspect(overrides)
    if not inspection.ok:
        trial.set_user_attr(NEVER_ATTR, "; ".join(inspection.problems))
        search.study.tell(trial, state=TrialState.FAIL)
        return trial, None
    job = [f"+hydra.sweeper.{k}={v}" for k, v in search.job_settings(trial).items()]
    extra = [*job, "+optuna_trial.plugin=optuna_trial"]
    return trial, {
        "label": label(overrides),
        "overrides": overrides,
        "limit_s": limit,
        "extra": extra,
    }


def tell(search: StudyInputs, trial, run: Trial) -> bool:
    """Tell the study what the run's summary.json says; True when the trial failed."""
    from optuna.trial import TrialState

    from tuneup.optuna import study as studies

    trial.set_user_attr(JOB_ATTR, run.job)
    trial.set_user_attr(studies.RUN_DIR_ATTR, str(run.directory))
    trial.set_user_attr(WORKER_ATTR, run.worker or None)
    if run.killed:
        return killed(search, trial, run)
    trial.set_user_attr("samples_seen", samples_seen(run))
    found = figures(run, search.settings.cost) if run.summary else {}
    for key in ("cost", "steps", "step_s", "validation_s"):
        trial.set_user_attr(key, found.get(key))
    status = (run.summary or {}).get("status")
    if status == "pruned":
        trial.set_user_attr("pruned_at_samples", (run.summary.get("pruned") or {}).get("samples"))
        search.study.tell(trial, state=TrialState.PRUNED)
        return False
    if not run.ok:
        trial.set_user_attr("error", run.error)
        search.study.tell(trial, state=TrialState.FAIL)
        return True
    trial.set_user_attr("reached", reached(run))
    value = trial_value(run, search.settings.cost)
    log.info(
        "autotune: trial %d: %s",
        trial.number,
        console_line({**found, "reached": reached(run)}, search.settings.cost),
    )
    if value is None:  # no speed window: no time to rank it by
        trial.set_user_attr("error", "no speed window in its summary.json")
        search.study.tell(trial, state=TrialState.FAIL)
        return True
    if not reached(run):
        value = above_the_hits(search.study, value, relative_gap(run))
    search.study.tell(trial, float(value))
    return False


def above_the_hits(study, value: float, gap: float) -> float:
    """A miss's value, at least the costliest hit's so far x (1 + its distance to the target):
    its cost so far alone can be below a hit's (fast steps that missed, slow ones that hit),
    and the sampler would then search where the target was missed. Hits are the trials that
    reached it, the baseline's included (it is a trial only when it reached)."""
    from optuna.trial import TrialState

    hits = [
        t.value
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if t.value is not None and (t.user_attrs.get("reached") or t.user_attrs.get(BASELINE_ATTR))
    ]
    return max(value, max(hits, default=0.0) * (1 + max(0.0, gap)))


def killed(search: StudyInputs, trial, run: Trial) -> bool:
    """A trial whose process was killed: failed; the first time, interrupted (it does not
    count towards the budget) and its parameters asked again; a retry killed again counts."""
    from optuna.trial import TrialState

    from tuneup.optuna.study import INTERRUPTED_ATTR, RETRY_ATTR

    again = trial.user_attrs.get(RETRY_ATTR) is None
    trial.set_user_attr("error", f"its process was killed before it finished ({run.directory})")
    if again:
        trial.set_user_attr(INTERRUPTED_ATTR, True)
    search.study.tell(trial, state=TrialState.FAIL)
    if again:
        search.study.enqueue_trial(trial.params, user_attrs={RETRY_ATTR: trial.number})
    log.warning(
        "autotune: trial %d (job %s): its process was killed; %s",
        trial.number,
        run.job,
        "its parameters are asked again" if again else "a retry, not asked again",
    )
    return True
