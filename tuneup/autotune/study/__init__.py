"""The study stage of ``autotune.objective=time_to_target``: an Optuna study of the training
hyperparameters, each trial trained to the target, up to ``autotune.workers`` at once.

Its interface: ``explore.explore(search)`` runs the study's trials until the budget is spent,
given a search that provides :class:`StudyInputs` (the study, its space, the trials so far and the
budget, :class:`StudyBudget`, which :class:`BudgetShare` computes). The modules: explore (ask,
launch, tell), space, family and companions (the space), sampler, leader (several sweepers on
one study; handover: lead or give way), workers (``autotune.workers``), budget and share (the minutes), trials (a study
trial's figures)."""

from tuneup.autotune.study.inputs import StudyBudget, StudyInputs
from tuneup.autotune.study.share import BudgetShare

__all__ = ["BudgetShare", "StudyBudget", "StudyInputs"]
