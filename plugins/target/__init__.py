"""Time to a target, the race's measure of speed: ``target.metric=val/acc target.value=0.94``.

MLPerf Training and airbench rank runs by the wall time to a validation accuracy, not by
samples per second; this plugin gives every run that figure. It validates on a cadence
(``target.check_every_n_steps``, or every epoch), records the metric at each validation with
the run's wall time and samples seen (:mod:`.race`), stops the run when the target is reached
(``target.stop=true``: the fit ends as at its limits, final checkpoint and summary included),
and writes the figures into summary.json (docs/race.md lists each key):

- ``time_to_target_s``: training and validation wall time from the first step to the end of
  the validation that first reached the target, as MLPerf counts it (start-up and the model's
  build are not in it; checkpoint saves are); ``time_to_target_train_s``: the same less the
  validations' time;
- ``steps_to_target``, ``samples_to_target``: optimizer steps, and samples of all processes,
  at that validation; ``device_hours_to_target``: time x processes / 3600;
  ``gpu_hours_to_target``: the same counting GPUs only (0.0 on CPU, as ``gpu_hours``); ``energy_kwh_to_target``: NVML's energy counter (:mod:`.energy`),
  None where there is none;
- ``target``: metric, value, mode, ``reached`` (None without a value: a budget run,
  ``trainer.max_time``, reports the ``best`` within it), ``best``, ``best_step``;
- ``target_history``, ``validation_time_s``, ``validations``: the cadence and its cost.

Inert until ``target.metric`` is set. Exact resume: the figures ride in the checkpoint, so a
resumed run reports the run's time to target; work after the last checkpoint of a killed
session is lost, its time too.
"""

from .plugin import Plugin, direction
from .race import Race

__all__ = ["Plugin", "Race", "direction"]
