"""The ``autotune`` config node (conf/experiment/autotune.yaml), read and checked once.

Every key is explained where it is set, in conf/experiment/autotune.yaml; a bad value stops
the search before any trial, naming the key, the value and what is allowed.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from omegaconf import OmegaConf

from tuneup import TuneupError

#: The dimension that is not a list of overrides: the batch size (and activation
#: checkpointing, tried with the larger batch it lets fit), tuneup/autotune/speed/batch.py.
BATCH = "batch_size"
LR_RULES = ("linear", "sqrt", "keep")
OBJECTIVES = ("throughput", "time_to_target")
PRUNERS = ("successive_halving", "hyperband", "none")
#: autotune.cost (time to target): what ranks the study's trials (study/trials.py: trial_cost)
COSTS = ("time", "steps", "samples")
SAMPLERS = ("tpe", "random")
#: autotune.stages: the speed features' walk (speed/search.py) and the time-to-target study
#: (time_to_target.py), run in this order by pipeline.py
SPEED, STUDY = "speed", "study"
STAGES = {"throughput": ((SPEED,),), "time_to_target": ((SPEED, STUDY), (STUDY,), (SPEED,))}


@dataclass(frozen=True)
class Settings:
    budget_minutes: float = 15.0
    trial_steps: int = 32
    trial_time_factor: float = 5.0
    min_rounds: int = 2
    max_rounds: int = 4
    confidence: float = 0.95
    loss_tolerance: float = 0.02
    epochs: float | None = None
    samples: int | None = None
    max_batch_factor: int = 8
    memory_headroom: float = 0.2
    lr_rule: str = "linear"
    probe_steps: int = 3
    allow_half_weights: bool = False
    objective: str = "throughput"
    seeds: int = 2
    max_seeds: int = 8
    race_margin: float = 1.5
    budget_trials: int = 20
    budget_samples: int | None = None
    confirm: int = 3
    pruner: str = "successive_halving"
    cost: str = "time"
    sampler: str = "tpe"
    sampler_seed: int | None = None
    storage: str | None = None
    study_name: str = "autotune"
    workers: int | None = None  # study trials at once (study/workers.py); null: the GPUs, or 1
    stages: tuple[str, ...] | None = None
    params: dict[str, str] | None = None
    dimensions: tuple[str, ...] = ()
    space: dict[str, list[tuple[str, ...]]] = field(default_factory=dict)

    @classmethod
    def from_config(cls, config) -> Settings:
        node = config.get("autotune")
        if node is None:
            raise TuneupError(
                "hydra/sweeper=autotune needs the autotune settings node; run it as "
                "tuneup -m experiment=autotune (conf/experiment/autotune.yaml)"
            )
        values = OmegaConf.to_container(node, resolve=True)
        space = values.pop("space", None) or {}
        dimensions = tuple(values.pop("dimensions", None) or ())
        params = values.pop("params", None)
        if isinstance(values.get("stages"), list):
            values["stages"] = tuple(values["stages"])
        unknown = sorted(set(values) - set(cls.__dataclass_fields__))
        if unknown:
            raise TuneupError(
                f"autotune.{unknown[0]} is not an autotune setting; the settings are: "
                f"{', '.join(sorted(set(cls.__dataclass_fields__) - {'space'}))}, space"
            )
        settings = cls(
            **values,
            dimensions=dimensions,
            params=None if params is None else flat_params(params),
            space={str(k): [tuple(shlex.split(str(c))) for c in v or []] for k, v in space.items()},
        )
        settings.check()
        return settings

    def check(self) -> None:
        rules = {  # key: (is it fine, what is allowed)
            "budget_minutes": (
                _number(self.budget_minutes, 0) and self.budget_minutes > 0,
                "a number > 0",
            ),
            "trial_steps": (_whole(self.trial_steps, 4), "an integer >= 4"),
            "trial_time_factor": (_number(self.trial_time_factor, 1), "a number >= 1"),
            "min_rounds": (_whole(self.min_rounds, 2), "an integer >= 2 (one round: no interval)"),
            "max_rounds": (_whole(self.max_rounds, self.min_rounds), ">= autotune.min_rounds"),
            "confidence": (
                _number(self.confidence, 0.5) and self.confidence < 1,
                "a number in [0.5, 1)",
            ),
            "loss_tolerance": (_number(self.loss_tolerance, 0), "a number >= 0"),
            "epochs": (self.epochs is None or _number(self.epochs, 1e-9), "null or a number > 0"),
            "samples": (self.samples is None or _whole(self.samples, 1), "null or an integer >= 1"),
            "max_batch_factor": (_whole(self.max_batch_factor, 1), "an integer >= 1 (1: keep)"),
            "memory_headroom": (
                _number(self.memory_headroom, 0) and self.memory_headroom < 1,
                "a fraction in [0, 1)",
            ),
            "lr_rule": (self.lr_rule in LR_RULES, " | ".join(LR_RULES)),
            "probe_steps": (_whole(self.probe_steps, 2), "an integer >= 2"),
            "allow_half_weights": (isinstance(self.allow_half_weights, bool), "true | false"),
            "objective": (self.objective in OBJECTIVES, " | ".join(OBJECTIVES)),
            "seeds": (_whole(self.seeds, 2), "an integer >= 2 (one seed: no interval)"),
            "max_seeds": (
                _whole(self.max_seeds, 2) and self.max_seeds >= self.seeds,
                f"an integer >= autotune.seeds ({self.seeds})",
            ),
            "race_margin": (_number(self.race_margin, 1), "a number >= 1"),
            "budget_trials": (_whole(self.budget_trials, 1), "an integer >= 1"),
            "budget_samples": (
                self.budget_samples is None or _whole(self.budget_samples, 1),
                "null or an integer >= 1",
            ),
            "confirm": (_whole(self.confirm, 1), "an integer >= 1"),
            "pruner": (self.pruner in PRUNERS, " | ".join(PRUNERS)),
            "cost": (self.cost in COSTS, " | ".join(COSTS)),
            "sampler": (self.sampler in SAMPLERS, " | ".join(SAMPLERS)),
            "sampler_seed": (
                self.sampler_seed is None or _whole(self.sampler_seed, 0),
                "null or an integer >= 0",
            ),
            "study_name": (
                isinstance(self.study_name, str) and self.study_name != "",
                "a non-empty name",
            ),
            "workers": (
                self.workers is None or _whole(self.workers, 1),
                "null (the GPUs a one-device run can have, 1 on a CPU) or an integer >= 1",
            ),
        }
        found = [
            f"autotune.{key}={getattr(self, key)!r} is not allowed: expected {allowed}"
            for key, (ok, allowed) in rules.items()
            if not ok
        ]
        for name in self.dimensions:
            if name != BATCH and name not in self.space:
                found.append(
                    f"autotune.dimensions has {name!r}, which autotune.space does not define; "
                    f"the dimensions defined are: {', '.join([*self.space, BATCH])}"
                )
        found += params_problems(self.params)
        found += stages_problems(self.stages, self.objective)
        if len(found) == 1:
            raise TuneupError(f"autotune settings: {found[0]}")
        if found:
            raise TuneupError("autotune settings:\n" + "\n".join(f"  - {f}" for f in found))

    @property
    def budget_seconds(self) -> float:
        return self.budget_minutes * 60

    @property
    def run_stages(self) -> tuple[str, ...]:
        """The stages this search runs: ``autotune.stages``, or the objective's default."""
        return self.stages or STAGES.get(self.objective, ((SPEED,),))[0]


def stages_problems(stages, objective: str) -> list[str]:
    """``autotune.stages`` that the objective does not run (the study needs a target)."""
    allowed = STAGES.get(objective)
    if stages is None or allowed is None or tuple(stages) in allowed:
        return []
    given = "[" + ",".join(map(str, stages)) + "]" if isinstance(stages, tuple) else stages
    expected = " | ".join("[" + ",".join(a) + "]" for a in allowed)
    why = (
        "" if objective != "throughput" else " (the study needs autotune.objective=time_to_target)"
    )
    return [
        f"autotune.stages={given} is not allowed with autotune.objective={objective}: "
        f"expected {expected}{why}"
    ]


def flat_params(params, prefix: str = "") -> dict[str, str]:
    """``autotune.params`` as ``{"optimizer.lr": "tag(log, interval(...))"}``: a nested node
    (``+autotune.params.model.lr=...`` nests) flattened to dotted keys."""
    if not isinstance(params, dict):
        return {prefix.rstrip(".") or "params": params}
    found = {}
    for key, value in params.items():
        if isinstance(value, dict):
            found.update(flat_params(value, f"{prefix}{key}."))
        else:
            found[f"{prefix}{key}"] = value
    return found


def params_problems(params: dict | None) -> list[str]:
    """Each ``autotune.params`` entry that is not Hydra sweeper syntax Optuna can sample."""
    if params is None:
        return []
    from tuneup.optuna.space import parse_space

    found = []
    for key, value in params.items():
        try:
            parse_space({key: value}, [])
        except TuneupError as exc:  # the space's own words: "<key>=<sweep>: why; allowed"
            why = str(exc).split(": ", 1)[-1]
            found.append(f"autotune.params.{key}={value!r} is not allowed: {why}")
        except Exception as exc:  # anything else Hydra or Optuna raises
            first = (str(exc).strip() or type(exc).__name__).splitlines()[0]
            found.append(
                f"autotune.params.{key}={value!r} is not allowed: {first}; expected a value or "
                "choice(a, b), interval(low, high), tag(log, interval(low, high)), range(...)"
            )
    return found


def _whole(value, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def _number(value, low: float) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value >= low
