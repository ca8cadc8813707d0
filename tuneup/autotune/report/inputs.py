"""What the answer is drawn from: a stage's search once it has run. autotune.json holds it
(record.py, study_record.py); autotune.md and autotune.png are drawn from that record alone.
The speed stage's :class:`~tuneup.autotune.speed.Search` provides :class:`SpeedAnswer`,
:class:`~tuneup.autotune.time_to_target.StudySearch` provides :class:`StudyAnswer`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import optuna

    from tuneup.autotune.settings import Settings
    from tuneup.autotune.speed.budget import Budget
    from tuneup.autotune.trials import Lab, Trial


class SpeedAnswer(Protocol):
    """The throughput objective's answer: the speed stage's path and its confirmation."""

    settings: Settings
    budget: Budget  # its elapsed seconds
    lab: Lab  # every trial it ran
    baseline: Trial | None  # your command's first trial
    recipe: tuple[str, ...]  # what it adopted
    outcomes: list  # each candidate's verdict (speed/outcome.py: Outcome)
    batch_notes: list[str]
    confirmation: Any  # the recipe against your command (speed/outcome.py: Contest), or None


class StudyAnswer(Protocol):
    """The time-to-target answer: the study, the confirmation's decisions and the timing."""

    settings: Settings
    budget: Budget
    lab: Lab
    seed: int  # the search seed (the paired and held-out seeds follow it)
    storage: str  # where the study is (autotune.md prints how to load it)
    study: optuna.Study
    space: Any  # the study's space (study/space.py: StudySpace)
    baseline: dict  # your command's figures on the search seed
    confirmed: dict[str, dict]  # label -> overrides, trials, decision
    speed: Any  # the pick timed against your command (confirm/speed.py: Speed), or None
    verdict: str
    recipe: tuple[str, ...]
    notes: list[str]
