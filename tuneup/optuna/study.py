"""The study and where it is stored, for the sweeper and for the trials its jobs run.

Storage (``hydra.sweeper.storage``):

- ``null``: a journal file ``optuna.journal`` in the sweep directory;
- a file path: a journal file there (Optuna's JournalFileBackend: appends under a file lock,
  safe for many processes, also on NFS, hence the default for joblib and Slurm jobs);
- a database URL (``sqlite:///optuna.db``, ``postgresql://...``): Optuna's RDBStorage.

The sweeper resolves it once (a path made absolute) and hands it to every job with the
trial's number (tuneup/optuna/sweeper.py), so a job anywhere opens the same study, reports its
validation metric to its trial and asks whether to stop (plugins/optuna_trial.py).

Continuing: a sweep killed mid-trial leaves that trial RUNNING in the storage. When a sweep
starts on a study, each RUNNING trial whose sweeper process is gone (same host, process not
alive) is marked FAIL and its values are asked again first (``enqueue_trial``); finished trials
stay finished and are never run again. Trials RUNNING under a live sweeper, or one on another
host, are left to it.
"""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuneup import TuneupError

log = logging.getLogger(__name__)

JOURNAL_FILE = "optuna.journal"
#: Trial user attributes the sweeper sets: which process runs the trial, and the run directory.
SWEEPER_ATTR, RUN_DIR_ATTR, INTERRUPTED_ATTR = (
    "tuneup_sweeper",
    "tuneup_run_dir",
    "tuneup_interrupted",
)


def resolve_storage(storage: str | None, sweep_dir: Path) -> str:
    """The storage as every job can open it: a URL as given, a journal path made absolute."""
    if storage is None or str(storage).strip() == "":
        return str((Path(sweep_dir) / JOURNAL_FILE).resolve())
    storage = str(storage)
    return storage if "://" in storage else str(Path(storage).expanduser().resolve())


def open_storage(storage: str):
    """The Optuna storage for a resolved ``storage`` string."""
    if "://" in storage:
        return optuna.storages.RDBStorage(storage)
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    Path(storage).parent.mkdir(parents=True, exist_ok=True)
    return JournalStorage(JournalFileBackend(storage))


def create_study(storage, name: str, sampler, pruner, directions: list[str]):
    """Create the study in ``storage`` (opened), or load it if the storage has one of this name
    (its directions must be these)."""
    study = optuna.create_study(
        storage=storage,
        study_name=name,
        sampler=sampler,
        pruner=pruner,
        directions=directions,
        load_if_exists=True,
    )
    stored = [d.name.lower() for d in study.directions]
    if stored != directions:
        raise TuneupError(
            f"hydra.sweeper.direction: {directions}, but the stored study '{name}' has "
            f"{stored}; give those, or another hydra.sweeper.study_name"
        )
    return study


#: ``hydra.sweeper.pruner=<name>``: Optuna's pruner with its defaults. The group form,
#: ``hydra/sweeper/pruner=<name>`` (conf/hydra/sweeper/pruner/), takes settings too.
PRUNERS = {
    "median": optuna.pruners.MedianPruner,
    "hyperband": optuna.pruners.HyperbandPruner,
    "none": optuna.pruners.NopPruner,
}


def make_pruner(spec):
    """The pruner ``hydra.sweeper.pruner`` gives: a name, a node with ``_target_``, or one Hydra
    has made already."""
    if isinstance(spec, optuna.pruners.BasePruner):
        return spec
    if isinstance(spec, str):
        if spec not in PRUNERS:
            raise TuneupError(f"hydra.sweeper.pruner: '{spec}' is not one of {', '.join(PRUNERS)} "
                              "(or hydra/sweeper/pruner=<name> with its settings)")  # fmt: skip
        return PRUNERS[spec]()
    from hydra.utils import instantiate

    return instantiate(spec)


def sweeper_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def is_gone(owner: str | None) -> bool:
    """Whether the sweeper process ``host:pid`` is known to be dead (only on this host)."""
    if not owner or ":" not in owner:
        return True  # no owner recorded: not started by a tuneup sweeper that is alive
    host, pid = owner.rsplit(":", 1)
    if host != socket.gethostname():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except (PermissionError, ValueError):
        return False
    return int(pid) == os.getpid()  # this process: a trial of an earlier sweep in it


def recover_interrupted(study, storage) -> list[FrozenTrial]:
    """Mark the RUNNING trials of a dead sweeper FAIL, and ask their values again first."""
    recovered = []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if not is_gone(trial.user_attrs.get(SWEEPER_ATTR)):
            log.info("optuna: trial %d is running under sweeper %s; left to it", trial.number,
                     trial.user_attrs.get(SWEEPER_ATTR))  # fmt: skip
            continue
        storage.set_trial_user_attr(trial_id(storage, study.study_name, trial.number),
                                    INTERRUPTED_ATTR, True)  # fmt: skip
        study.tell(trial.number, state=TrialState.FAIL)
        if trial.params and SWEEPER_ATTR in trial.user_attrs:  # it was launched: run it again
            study.enqueue_trial(trial.params)
        log.info("optuna: trial %d was running when its sweep stopped: marked failed, its "
                 "values asked again", trial.number)  # fmt: skip
        recovered.append(trial)
    return recovered


def finished(study) -> list[FrozenTrial]:
    """The trials that count towards n_trials: complete, pruned, or failed by the run itself
    (a trial whose sweep was killed under it is asked again, so it does not count)."""
    return [
        t
        for t in study.get_trials(deepcopy=False)
        if t.state in (TrialState.COMPLETE, TrialState.PRUNED)
        or (t.state == TrialState.FAIL and not t.user_attrs.get(INTERRUPTED_ATTR))
    ]


def load_trial(storage: str, name: str, number: int, pruner):
    """The running trial ``number`` of the stored study, for the job that runs it."""
    opened = open_storage(storage)
    study = optuna.load_study(
        study_name=name,
        storage=opened,
        sampler=optuna.samplers.RandomSampler(),  # a job asks nothing: no model to build
        pruner=pruner,
    )
    return optuna.trial.Trial(study, trial_id(opened, name, number))


def trial_id(storage, name: str, number: int) -> int:
    """The storage's id of trial ``number`` of study ``name`` (its public storage API)."""
    return storage.get_trial_id_from_study_id_trial_number(
        storage.get_study_id_from_name(name), number
    )
