"""Continuing a stored study: what a new sweeping process does so that it picks up where a
killed one stopped, besides failing that one's running trials (study.py
:func:`~tuneup.optuna.study.recover_interrupted`).

- The sampler's seed: Optuna keeps no sampler state in the storage (its FAQ: pickle the
  sampler to resume it), so a sampler made again from ``seed: 0`` in a new process draws the
  first process's values again: the continued trials would repeat the first ones.
  :func:`continued_sampler` makes the sampler again from its config node with a seed derived
  from the seed and the study's number of trials (numpy's ``SeedSequence``): the same command
  continues the same way, and never from where an earlier process started. QMCSampler and
  GridSampler are left alone: they count their own draws (grid points) in the storage, by
  places in what their seed made.
- The interrupted trial's run directory: the process died before the run wrote its
  summary.json (or Ctrl-C stopped it, and its summary says how to resume that trial alone),
  so the sweep report would count it as a run that did not finish.
  :func:`mark_interrupted_runs` writes one, ``status: interrupted`` with the trial that runs its
  values again (``optuna_trial.run_again_as``), which the report lists and does not count.
"""

from __future__ import annotations

import logging
from pathlib import Path

import optuna
from omegaconf import OmegaConf
from optuna.trial import FrozenTrial

log = logging.getLogger(__name__)

#: summary.json's key for a run that was an Optuna trial whose sweep was killed under it.
TRIAL_KEY = "optuna_trial"


def derived_seed(seed: int, stored: int) -> int:
    """The sampler's seed for a study that holds ``stored`` trials; ``seed`` for a new one."""
    import numpy as np

    if stored == 0:
        return seed
    return int(np.random.SeedSequence([int(seed), stored]).generate_state(1)[0])


def continued_sampler(node, sampler, stored: int):
    """The sampler to continue a study of ``stored`` trials with: made again from its Hydra
    node (``hydra.sweeper.sampler``) with :func:`derived_seed`, or ``sampler`` itself for a new
    study, a node without a seed, a QMCSampler or a GridSampler (as Hydra makes it: partial,
    the sweeper gives it the grid). The grid keeps its seed: the ``grid_id`` each trial holds
    in the storage is a place in the grid as that seed shuffles it, which the sampler reads to
    skip the points already run; another seed would run them again and leave others out."""
    from hydra.utils import instantiate

    seed = node.get("seed") if node is not None else None
    if stored == 0 or not isinstance(seed, int) or isinstance(seed, bool):
        return sampler
    if isinstance(sampler, optuna.samplers.QMCSampler):
        return sampler
    if is_grid(node, sampler):  # its grid ids are places in its seed's shuffle: keep the seed
        return sampler
    seed = derived_seed(seed, stored)
    log.info(
        "optuna: the study has %d trials: the sampler's seed %d -> %d, so that it does not "
        "draw the first sweep's values again",
        stored,
        node.seed,
        seed,
    )
    return instantiate(node, seed=seed)


def is_grid(node, sampler) -> bool:
    """Whether the sampler (made, or a partial of Hydra's) or its node is a GridSampler."""
    made = getattr(sampler, "func", sampler)
    if isinstance(made, type) and issubclass(made, optuna.samplers.GridSampler):
        return True
    if isinstance(made, optuna.samplers.GridSampler):
        return True
    target = str(node.get("_target_") or "") if node is not None else ""
    return target.rsplit(".", 1)[-1] == "GridSampler"


def mark_interrupted_runs(sweep_dir: Path, study, recovered: list[FrozenTrial]) -> list[Path]:
    """Write ``summary.json`` into the run directories (under ``sweep_dir``) of the ``recovered``
    trials that have none; returns their paths."""
    from tuneup.trainer import summary as run_summary

    if not recovered:
        return []
    from tuneup.optuna.study import RETRY_ATTR

    numbers = {t.number: t for t in recovered}
    again = {t.user_attrs.get(RETRY_ATTR): t.number for t in _waiting(study)}
    written = []
    for config in Path(sweep_dir).rglob("hydra.yaml"):
        run_dir = config.parent.parent
        stopped = _stopped_summary(run_dir) if config.parent.name == ".hydra" else None
        if stopped is None:
            continue
        sweeper = OmegaConf.select(OmegaConf.load(config), "hydra.sweeper", default=None) or {}
        trial = numbers.get(sweeper.get("trial"))
        if trial is None or sweeper.get("study_name") != study.study_name:
            continue
        retry = again.get(trial.number)
        then = f"its values run again as trial {retry}" if retry is not None else "not run again"
        how = "stopped (Ctrl-C)" if stopped else "killed"
        summary = {
            **stopped,
            "status": "interrupted",
            "run_dir": str(run_dir),
            "error": f"the sweep was {how} while trial {trial.number} ran: the trial was marked "
            f"failed, {then}",
            TRIAL_KEY: {"number": trial.number, "run_again_as": retry},
        }
        written.append(run_summary.write(summary, run_dir))
    return written


def _stopped_summary(run_dir: Path) -> dict | None:
    """What a run left of a trial stopped under its sweep: ``{}`` without summary.json (killed),
    its own summary when Ctrl-C stopped it (``status: interrupted``, its figures so far, an
    error that would resume the trial alone); None for any other run, which is left as it is."""
    from tuneup.trainer import summary as run_summary

    if not (run_dir / run_summary.FILE_NAME).exists():
        return {}
    try:
        found = run_summary.read(run_dir)
    except (OSError, ValueError):
        return None
    stopped = found.get("status") == "interrupted" and found.get(TRIAL_KEY) is None
    return found if stopped else None


def _waiting(study) -> list[FrozenTrial]:
    from optuna.trial import TrialState

    return study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
