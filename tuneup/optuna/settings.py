"""The Optuna sweeper's settings: its node (conf/hydra/sweeper/optuna.yaml), checked.

Kept apart from the sweep itself (sweeper.py): a bad setting is refused here, in one line
naming the key, before the sweeper opens a study or launches a job.
"""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import OmegaConf

from tuneup import TuneupError

DIRECTIONS = ("maximize", "minimize")


@dataclass
class Settings:
    """The sweeper's node (conf/hydra/sweeper/optuna.yaml), checked."""

    objectives: list[str]
    directions: list[str]
    n_trials: int
    n_jobs: int
    max_failure_rate: float
    study_name: str | None
    storage: str | None

    @classmethod
    def from_node(cls, node) -> Settings:
        objectives = _as_list(node.get("objectives") or ["val.acc"])
        directions = [str(d).lower() for d in _as_list(node.get("direction", "maximize"))]
        for direction in directions:
            if direction not in DIRECTIONS:
                raise TuneupError(
                    f"hydra.sweeper.direction: '{direction}' is not maximize or minimize"
                )
        if len(directions) != len(objectives):
            raise TuneupError(
                f"hydra.sweeper.direction: {len(directions)} direction(s) for "
                f"{len(objectives)} objective(s) {objectives}; give one per objective "
                "(hydra.sweeper.objectives)"
            )
        for key in ("n_trials", "n_jobs"):
            value = node.get(key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise TuneupError(f"hydra.sweeper.{key}: {value!r} is not an integer >= 1")
        rate = node.get("max_failure_rate", 1.0)
        if not isinstance(rate, (int, float)) or not 0 <= rate <= 1:
            raise TuneupError(f"hydra.sweeper.max_failure_rate: {rate!r} is not in [0, 1]")
        storage = node.get("storage")
        return cls(
            objectives,
            directions,
            node.n_trials,
            node.n_jobs,
            float(rate),
            node.get("study_name"),
            None if storage is None else str(storage),
        )


def _as_list(value) -> list:
    return (
        [str(v) for v in value]
        if OmegaConf.is_list(value) or isinstance(value, list)
        else [str(value)]
    )
