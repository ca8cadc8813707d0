"""What the confirmation is given: the study's trials (``study``), its budget
(:class:`~tuneup.autotune.study.inputs.StudyBudget`), and where its decisions go (``confirmed``,
``verdict``, ``recipe``). :class:`~tuneup.autotune.time_to_target.StudySearch` provides it;
a test's fake may as well."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from tuneup.autotune.study.inputs import StudyBudget, StudyRuns

if TYPE_CHECKING:
    import optuna

    from tuneup.autotune.settings import Settings
    from tuneup.autotune.study.workers import Workers
    from tuneup.autotune.trials import Lab


class ConfirmInputs(StudyBudget, StudyRuns, Protocol):
    """What seeds.py (the paired seeds, the decision), candidates.py (what they confirm),
    speed.py and step_cost.py (the timing) and advice.py (the verdict when nothing was
    confirmed) read, and what they decide."""

    settings: Settings
    study: optuna.Study  # its finished trials are the candidates
    lab: Lab
    workers: Workers
    seed: int  # the search seed: the paired seeds are the ones after it
    user_config: Any
    baseline: dict  # your command's figures on the search seed
    notes: list[str]
    # the decisions, written here
    confirmed: dict[str, dict]  # label -> overrides, trials, decision (the baseline's too)
    step_cost: dict[tuple[str, ...], float]  # s/step timed apart, where the workers shared cores
    speed: Any  # the pick timed against your command (confirm.speed.Speed), or None
    verdict: str  # the answer, in words
    recipe: tuple[str, ...]  # the pick's overrides, when adopted

    def batch(self, overrides: Sequence[str]) -> int:
        """Samples per optimizer step of a configuration."""
        ...
