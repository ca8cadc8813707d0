"""The confirmation stage of ``autotune.objective=time_to_target``: the study's best
configurations and the user's command on paired seeds, the decision, and the pick timed
against the command.

Its interface: :func:`confirm` then :func:`decide`, given a search that provides
:class:`ConfirmInputs` (the study's trials, the budget, and where the decisions go:
``confirmed``, ``verdict``, ``recipe``). The modules: seeds (the paired seeds and the
decision), candidates (the study's best configurations, which the seeds confirm), distinct
(one candidate per distinct configuration), speed (the pick's seconds per step against the
command's), step_cost (seconds per step timed apart where the workers shared the cores),
advice (the verdict when nothing was confirmed)."""

from tuneup.autotune.confirm.inputs import ConfirmInputs
from tuneup.autotune.confirm.seeds import confirm, decide

__all__ = ["ConfirmInputs", "confirm", "decide"]
