"""metrics.csv: Lightning's CSV logger, writing nothing until the run logs its first row.

Lightning's CSV logger deletes an existing metrics.csv when its writer is made, as training
is set up (before a resumed run's checkpoint and data are checked), and writes the
hyperparameters then. Here the writer writes at its first row: only then is an earlier
metrics.csv (a resumed run's) moved to ``metrics-<n>.csv``, and hparams.yaml written; a
resume refused before training leaves the run's metrics as they were (trainer/state/run_dir.py
``Claim``). It does not warn that the directory is not empty: it deletes nothing.
"""

from __future__ import annotations

from pathlib import Path

from lightning_fabric.loggers.logger import rank_zero_experiment
from lightning_fabric.utilities.rank_zero import rank_zero_only
from pytorch_lightning.loggers import CSVLogger
from pytorch_lightning.loggers.csv_logs import ExperimentWriter


def keep_earlier_metrics(save_dir: str) -> Path | None:
    """Move an earlier ``metrics.csv`` (a resumed run's) to ``metrics-<n>.csv``: a resumed
    run must not lose the rows of the sessions before it."""
    current = Path(save_dir) / "metrics.csv"
    if rank_zero_only.rank != 0 or not current.is_file():
        return None
    n = 1
    while (kept := current.with_name(f"metrics-{n}.csv")).exists():
        n += 1
    current.rename(kept)
    return kept


class MetricsWriter(ExperimentWriter):
    """Lightning's writer of metrics.csv (and hparams.yaml), which writes, and moves an
    earlier metrics.csv aside, only at its first row: not when it is made, as training is
    set up, where Lightning's deletes that file."""

    def __init__(self, log_dir: str) -> None:
        super().__init__(log_dir)
        self.started = False

    def _check_log_dir_exists(self) -> None:
        """Lightning's deletes an earlier metrics.csv here; it is moved aside at the first row."""

    def log_hparams(self, params: dict) -> None:
        self.hparams.update(params)
        if self.started:
            super().log_hparams({})

    def save(self) -> None:
        if self.metrics and not self.started:
            self.started = True
            keep_earlier_metrics(self.log_dir)
            if self.hparams:
                super().log_hparams({})
        super().save()


class MetricsFile(CSVLogger):
    """``<save_dir>/metrics.csv`` (:class:`MetricsWriter`), every row written at once
    (Lightning's default holds 100 in memory): a run killed with -9 keeps its rows up to
    the kill."""

    def __init__(self, save_dir: str) -> None:
        super().__init__(save_dir=save_dir, name="", version="", flush_logs_every_n_steps=1)

    @property
    @rank_zero_experiment
    def experiment(self) -> MetricsWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = MetricsWriter(log_dir=self.log_dir)
        return self._experiment
