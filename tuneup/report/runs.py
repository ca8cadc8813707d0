"""The runs a report compares: the run directories found under the report's directory.

A run directory is one that holds ``summary.json`` (written by every run, also
a failed one) or Hydra's ``.hydra/overrides.yaml`` (the overrides that made the
run). A run whose process died before it wrote its summary has only the
latter; it is listed with status "no summary.json". Runs are named by their
path under the report's directory: the job number in a sweep
(``multirun/<date>/<time>/3``), ``<date>/<time>`` in a directory of single
runs (``outputs/``).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

from tuneup.trainer import summary as run_summary

NO_SUMMARY = "no summary.json"
SEED = "seed"
#: Folders that hold copies of runs' summaries, not runs: logger=mlflow's artifacts
#: (plugins/logger/mlflow_run.py), in a run directory or beside a sweep's shared store.
COPIES = {"mlartifacts", "mlruns"}


@dataclass
class Run:
    name: str
    path: Path
    overrides: list[str]
    summary: dict | None

    @property
    def status(self) -> str:
        return self.summary.get("status", "unknown") if self.summary else NO_SUMMARY

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def run_again(self) -> bool:
        """Whether the run is an Optuna trial whose sweep was killed under it and whose values
        a later trial ran again (tuneup/optuna/resume.py): no failure of the sweep."""
        trial = (self.summary or {}).get("optuna_trial")
        return isinstance(trial, dict) and trial.get("run_again_as") is not None

    @property
    def samples_per_s(self) -> float | None:
        return (self.summary or {}).get("samples_per_s")

    @property
    def windows(self) -> list[float]:
        """samples/s of the run's speed windows (plugins/measure/figures.py): its spread."""
        return [w for w in (self.summary or {}).get("samples_per_s_windows") or [] if w]

    @property
    def peak_memory_bytes(self) -> int | None:
        return (self.summary or {}).get("peak_memory_bytes")

    @property
    def train_loss(self) -> float | None:
        return (self.summary or {}).get("train_loss")

    @property
    def val_acc(self) -> float | None:
        return ((self.summary or {}).get("val") or {}).get("acc")

    @property
    def error_line(self) -> str | None:
        """The error's last line, with the exception type: what a failed run says went wrong."""
        error = (self.summary or {}).get("error")
        if not error:
            return None
        lines = [line.strip() for line in error.splitlines() if line.strip()]
        kind = lines[0].split(":", 1)[0]
        last = lines[-1].lstrip("- ")
        return lines[0] if len(lines) == 1 else f"{kind}: {last}"


def find_runs(directory: Path) -> list[Run]:
    """Every run under ``directory`` (itself included), in job order (natural sort of names)."""
    directory = Path(directory)
    found = {
        path.parent
        for path in directory.rglob(run_summary.FILE_NAME)
        if not COPIES.intersection(path.relative_to(directory).parts)
    }
    found |= {
        path.parent.parent
        for path in directory.rglob("overrides.yaml")
        if path.parent.name == ".hydra"
    }
    runs = [read_run(path, _name(path, directory)) for path in found]
    return sorted(runs, key=lambda run: natural_key(run.name))


def read_run(path: Path, name: str) -> Run:
    summary_path = path / run_summary.FILE_NAME
    summary = run_summary.read(path) if summary_path.is_file() else None
    return Run(name=name, path=path, overrides=saved_overrides(path), summary=summary)


def saved_overrides(run_dir: Path) -> list[str]:
    path = run_dir / ".hydra" / "overrides.yaml"
    return [str(o) for o in OmegaConf.load(path)] if path.is_file() else []


def saved_node(run_dir: Path, file_name: str, key: str):
    """A node of a config Hydra saved with the run (``.hydra/config.yaml``, ``hydra.yaml``)."""
    path = run_dir / ".hydra" / file_name
    if not path.is_file():
        return None
    return OmegaConf.select(OmegaConf.load(path), key, default=None)


def natural_key(name: str) -> list:
    """Sort key that puts run "10" after run "9"."""
    return [
        (0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", name)
    ]


def _name(path: Path, directory: Path) -> str:
    relative = path.relative_to(directory)
    return path.name if relative == Path() else relative.as_posix()


def seed_of(run: Run) -> str | None:
    for override in run.overrides:
        key, _, value = override.lstrip("+~").partition("=")
        if key == SEED and value.lstrip("-").isdigit():
            return value
    return None


def reproduce_command(run: Run, multirun_seeds: list[str] | None = None) -> str:
    """The command that runs ``run`` again, as the user started it; with ``multirun_seeds``,
    a sweep over those seeds instead of the run's own."""
    ran = (run.summary or {}).get("command") or "python run.py"
    overrides = _reproducing(run)
    if multirun_seeds:
        overrides = [o for o in overrides if o.lstrip("+~").partition("=")[0] != "seed"]
        overrides = ["-m", *overrides, f"seed={','.join(multirun_seeds)}"]
    return " ".join([ran, *map(shlex.quote, overrides)])


def _reproducing(run: Run) -> list[str]:
    """The run's overrides minus report settings, which do not change a run."""
    return [o for o in run.overrides if not o.lstrip("+~").startswith("report.")]
