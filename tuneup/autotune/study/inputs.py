"""What the study stage is given, stated as Optuna states what a sampler is given
(``BaseSampler.sample_relative(study, trial, search_space)``): the study, its budget, the
trials so far. :class:`~tuneup.autotune.time_to_target.StudySearch` provides these protocols;
a test's fake may provide them as well, and the confirmation
(:mod:`tuneup.autotune.confirm.inputs`) asks for the same budget and runs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import optuna

    from tuneup.autotune.settings import Settings
    from tuneup.autotune.space import Checks
    from tuneup.autotune.study.space import StudySpace
    from tuneup.autotune.study.workers import Workers
    from tuneup.autotune.trials import Lab, Trial


class StudyBudget(Protocol):
    """``autotune.budget_minutes`` as the stages spend it (study/share.py computes it,
    study/budget.py holds the arithmetic): each stage asks what is left and what the stages
    after it keep, and starts nothing that could not finish in the rest."""

    def left(self) -> float:
        """Seconds left of the whole budget."""
        ...

    def typical_seconds(self) -> float:
        """A race trial's expected seconds (the median of the trials so far)."""
        ...

    def confirm_seconds(self) -> float:
        """A confirmation run's expected seconds (a run to the target)."""
        ...

    def speed_reserve(self) -> float:
        """Seconds kept for the pick's timing against your command."""
        ...

    def reserve(self) -> float:
        """Seconds the study leaves for the confirmation and the timing."""
        ...


class StudyRuns(Protocol):
    """The study's trials and its runs, as both the study and the confirmation read them:
    the trials finished so far, and a run to the target as a job of the sweep."""

    def explored(self) -> list:
        """The study's finished trials, the baseline's aside."""
        ...

    def race_run(
        self,
        name: str,
        overrides: Sequence[str],
        seed: int,
        samples: int | None,
        limit_s: float,
        extra: Sequence[str] = (),
        worker=None,
    ) -> Trial:
        """``overrides`` trained to the target on ``seed`` (a job of the sweep)."""
        ...


class StudyInputs(StudyBudget, StudyRuns, Protocol):
    """What the study's explore stage and its sweepers' rules (explore.py, leader.py) read of
    the search that runs them, and the notes and tickets they write back."""

    settings: Settings
    study: optuna.Study
    space: StudySpace
    checks: Checks
    lab: Lab
    workers: Workers
    seed: int
    user_config: Any  # your command's config (the checks' composition of it)
    baseline: dict  # your command's figures on the search seed
    sweeper: str  # host:pid, as the study's trials and tickets name this sweeper
    ticket: int | None  # the number of this sweeper's first trial
    answered_by: dict | None  # the sweeper that answers, when not this one
    notes: list[str]  # what the answer says about the search (autotune.md)

    def job_settings(self, trial) -> dict:
        """The ``hydra.sweeper`` settings a study trial's job reports to the study with."""
        ...
