"""Loggers that write nothing until the run is accepted (the hook ``on_run_accepted``).

Lightning makes every logger's experiment as the fit is set up (its ``_call_setup_hook``),
before a resumed run's checkpoint, data and plugins are checked: TensorBoard's first event
file, wandb's offline run, MLflow's run in ``mlflow.db``. A resume refused then would have
written into the run it refused. A held logger makes nothing until :meth:`Held.accept`: its
``experiment`` is Lightning's stand-in of the other ranks (which does nothing), and what is
logged before then (a module's ``save_hyperparameters``, which Lightning logs at set-up) is
kept in memory and logged at acceptance, in the order it came. A run refused before training
starts leaves the run directory as it was (trainer/state/run_dir.py ``Claim``).
"""

from __future__ import annotations

from lightning_fabric.loggers.logger import _DummyExperiment
from pytorch_lightning.loggers import TensorBoardLogger, WandbLogger

from .csv_file import MetricsFile

#: The calls that log something: held until the run is accepted, then made in their order.
LOGGING = ("log_hyperparams", "log_metrics", "log_graph")


class Held:
    """Mixin before a Lightning logger class: nothing made or written until :meth:`accept`."""

    def __init__(self, *args, **kwargs) -> None:
        self.accepted = False
        self.held: list[tuple[str, tuple, dict]] = []
        super().__init__(*args, **kwargs)

    @property
    def experiment(self):
        if not self.accepted:
            return _DummyExperiment()  # what Lightning's other ranks get: made later, or never
        return super().experiment

    def accept(self) -> None:
        """The run is accepted: log what was held, in its order (each logger makes its
        experiment at its first use, as Lightning's do)."""
        if self.accepted:
            return
        self.accepted = True
        self.start()
        held, self.held = self.held, []
        for name, args, kwargs in held:
            getattr(super(), name)(*args, **kwargs)
        if held:
            super().save()

    def start(self) -> None:
        """At acceptance, before what was held is logged (a logger that must find or make its
        run first); by default nothing: each logger makes its experiment at its first use."""

    def log_hyperparams(self, *args, **kwargs):
        return self._log("log_hyperparams", args, kwargs)

    def log_metrics(self, *args, **kwargs):
        return self._log("log_metrics", args, kwargs)

    def log_graph(self, *args, **kwargs):
        return self._log("log_graph", args, kwargs)

    def _log(self, name: str, args: tuple, kwargs: dict):
        if self.accepted:
            return getattr(super(), name)(*args, **kwargs)
        self.held.append((name, args, kwargs))
        return None

    def save(self) -> None:
        if self.accepted:
            super().save()

    def finalize(self, status: str) -> None:
        """A run refused before acceptance ends here too (Lightning finalizes its loggers when
        the fit fails): nothing was made, nothing to close or save."""
        if self.accepted:
            super().finalize(status)

    def after_save_checkpoint(self, checkpoint_callback) -> None:
        if self.accepted:
            super().after_save_checkpoint(checkpoint_callback)


class HeldMetricsFile(Held, MetricsFile):
    """metrics.csv (:mod:`.csv_file`), held until the run is accepted."""


class HeldTensorBoardLogger(Held, TensorBoardLogger):
    """Lightning's TensorBoard logger, held until the run is accepted: no event file before."""


class HeldWandbLogger(Held, WandbLogger):
    """Lightning's wandb logger, held until the run is accepted: no wandb run before."""
