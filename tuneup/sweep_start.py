"""The sweep this command started, noted by a Hydra callback (``hydra.callbacks.sweep_start`` in
conf/config.yaml) when the multirun starts: before its sweeper sets up and before any job.

Ctrl-C reaches the command's own process; its jobs may run in other processes (joblib's
workers, submitit's jobs) or not have started, so Hydra's config of a job is not there to say
which sweep was stopped. tuneup/cli.py reads :data:`started` for its one line.
"""

from __future__ import annotations

from hydra.experimental.callback import Callback

#: (the sweep directory, whether its sweeper is tuneup's autotune or Optuna sweeper: a study
#: that the same command with that directory continues); None before a multirun started.
started: tuple[str, bool] | None = None


def sweep_of(hydra) -> tuple[str, bool]:
    """(directory, keeps a study) of the sweep that Hydra config node ``hydra`` describes."""
    sweeper = str(hydra.sweeper.get("_target_") or "")
    return str(hydra.sweep.dir), sweeper.startswith("hydra_plugins.tuneup_")


class SweepStart(Callback):
    def on_multirun_start(self, config, **kwargs) -> None:
        global started
        started = sweep_of(config.hydra)
