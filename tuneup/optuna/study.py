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
starts on a study, and as a sweeper asks its trials, each RUNNING trial whose sweeper is gone
(tuneup/optuna/liveness.py: its process dead on this host, its heartbeat stale or ended on
another) is marked FAIL and its values are asked again first (``enqueue_trial``); finished
trials stay finished and are never run again. Trials RUNNING under a live sweeper are left
to it.
"""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from pathlib import Path

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuneup import TuneupError
from tuneup.optuna.liveness import is_gone, lost, sweeper_id  # noqa: F401 (re-exported)

log = logging.getLogger(__name__)

JOURNAL_FILE = "optuna.journal"
#: Trial user attributes the sweeper sets: which process runs the trial, and the run directory.
SWEEPER_ATTR, RUN_DIR_ATTR, INTERRUPTED_ATTR = (
    "tuneup_sweeper",
    "tuneup_run_dir",
    "tuneup_interrupted",
)
#: The user attribute of a trial that runs an interrupted trial's values again: that one's number.
RETRY_ATTR = "tuneup_retry_of"


def resolve_storage(storage: str | None, sweep_dir: Path) -> str:
    """The storage as every job can open it: a URL as given, a journal path made absolute."""
    if storage is None or str(storage).strip() == "":
        return str((Path(sweep_dir) / JOURNAL_FILE).resolve())
    storage = str(storage)
    return storage if "://" in storage else str(Path(storage).expanduser().resolve())


def open_storage(storage: str, key: str = "hydra.sweeper.storage"):
    """The Optuna storage for a resolved ``storage`` string, checked writable: one that cannot
    be opened or written is a :class:`TuneupError` naming it as the user gave it (``key``: the
    setting, ``autotune.storage`` for the autotune's study), before any trial runs."""
    with storage_errors(storage, key):
        if "://" in storage:
            if _password(storage):
                log.warning(
                    "%s holds a password, which Hydra writes into the sweep's multirun.yaml and "
                    "each job's .hydra/overrides.yaml; give it in ~/.pgpass or PGPASSWORD and "
                    "leave it out of the URL",
                    key,
                )
            return optuna.storages.RDBStorage(storage)
        from optuna.storages.journal import (
            JournalFileBackend,
            JournalFileSymlinkLock,
            JournalStorage,
        )

        Path(storage).parent.mkdir(parents=True, exist_ok=True)
        with open(storage, "ab"):  # Optuna opens it for writing only when it first appends
            pass
        lock = JournalFileSymlinkLock(storage)  # Optuna's default, made here to try it now:
        lock.acquire()  # a link beside the file, so a read-only folder fails here
        lock.release()
        return JournalStorage(JournalFileBackend(storage, lock_obj=lock))


@contextmanager
def storage_errors(storage: str, key: str = "hydra.sweeper.storage"):
    """The file system's or the database's error, for a storage that cannot be opened or
    written (a read-only folder, a missing one, a server that does not answer), as one line that
    names the storage, instead of SQLAlchemy's or sqlite's traceback."""
    try:
        yield
    except TuneupError:
        raise
    except Exception as exc:
        if not _storage_error(exc):
            raise
        raise TuneupError(
            f"{key}={_shown(storage)}: cannot open or write the study's "
            f"{'database' if '://' in storage else 'journal file'}: {_reason(exc)}"
            f"{_hint(storage)}; {_advice(storage)}"
        ) from exc


def _storage_error(exc: BaseException) -> bool:
    """Errors of the storage itself: the file system, SQLAlchemy (its driver's included)."""
    if isinstance(exc, (OSError, ImportError)):
        return True
    return any(c.__module__.startswith("sqlalchemy") for c in type(exc).__mro__)


def _reason(exc: BaseException) -> str:
    """The error's own words: sqlite's ``unable to open database file``, ``[Errno 13] ...``."""
    original = getattr(exc, "orig", None)  # SQLAlchemy's DBAPIError wraps the driver's error
    text = str(original if original is not None else exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _hint(storage: str) -> str:
    """What is wrong with the file's folder, where that can be told."""
    path = _file(storage)
    if path is None:
        return ""
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        return f" ({folder} is not a folder)"
    if folder != path.parent and "://" in storage:
        return f" (the folder {path.parent} does not exist)"
    if not os.access(folder, os.W_OK):
        return f" (the folder {folder} is read-only)"
    return ""


def _advice(storage: str) -> str:
    if _file(storage) is None and "://" in storage:
        return "check the URL, that the server answers, and that its driver is installed"
    return "give a storage in a folder you can write (a journal file path, or sqlite:///path/optuna.db)"


def _file(storage: str) -> Path | None:
    """The file a storage is kept in: a journal's path, an SQLite database's; None for a server."""
    if "://" not in storage:
        return Path(storage)
    if storage.startswith("sqlite:///") and not storage.startswith("sqlite:///:memory:"):
        return Path(storage.removeprefix("sqlite:///").split("?", 1)[0]).expanduser()
    return None


def _password(storage: str) -> bool:
    """Whether a database URL carries a password (``user:secret@host``)."""
    try:
        from sqlalchemy.engine import make_url

        return bool(make_url(storage).password)
    except Exception:  # not a URL SQLAlchemy reads: the storage's own error says so
        return False


def _shown(storage: str) -> str:
    """The storage as the error shows it: a database URL without its password."""
    if "://" not in storage:
        return storage
    try:
        from sqlalchemy.engine import make_url

        return make_url(storage).render_as_string(hide_password=True)
    except Exception:  # not a URL SQLAlchemy reads: shown as given
        return storage


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
            raise TuneupError(
                f"hydra.sweeper.pruner: '{spec}' is not one of {', '.join(PRUNERS)} "
                "(or hydra/sweeper/pruner=<name> with its settings)"
            )
        return PRUNERS[spec]()
    from hydra.utils import instantiate

    return instantiate(spec)


def recover_interrupted(study, storage=None, keep: str | None = None, quiet: bool = False):
    """Mark the RUNNING trials of a sweeper that is gone FAIL (:func:`is_gone`: a dead process
    on this host, a lost or ended heartbeat on another), and ask their values again first.
    ``keep``: a sweeper whose trials are left (the one that asks, mid-sweep; then a trial
    with no sweeper recorded is another's, just asked, and left too); ``quiet``: no
    line for the trials left to a live sweeper. Two sweepers recovering one trial at once:
    the storage lets one fail it, and only that one asks its values again. ``storage``: the
    study's own when not given (as Optuna's ``fail_stale_trials`` reads it)."""
    storage = study._storage if storage is None else storage
    attrs, recovered = study.user_attrs, []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        owner = trial.user_attrs.get(SWEEPER_ATTR)
        if keep is not None and owner in (keep, None):  # None: just asked, its owner not yet set
            continue
        if not is_gone(owner, attrs):
            if not quiet:
                log.info(
                    "optuna: trial %d is running under sweeper %s; left to it", trial.number, owner
                )
            continue
        if not _fail(study, storage, trial):
            continue  # another sweeper recovered it
        if trial.params and SWEEPER_ATTR in trial.user_attrs:  # it was launched: run it again
            study.enqueue_trial(trial.params, user_attrs={RETRY_ATTR: trial.number})
        log.info(
            "optuna: trial %d was running when its sweeper %s stopped%s: marked failed, its "
            "values asked again",
            trial.number,
            owner,
            " (its heartbeat is stale: host lost)" if owner and lost(owner, attrs) else "",
        )
        recovered.append(trial)
    return recovered


def _fail(study, storage, trial) -> bool:
    """Mark ``trial`` interrupted and failed; False when it finished meanwhile (told by its
    sweeper, or failed by another sweeper that recovered it first)."""
    from optuna.exceptions import UpdateFinishedTrialError

    try:
        storage.set_trial_user_attr(
            trial_id(storage, study.study_name, trial.number), INTERRUPTED_ATTR, True
        )
        study.tell(trial.number, state=TrialState.FAIL)
    except (UpdateFinishedTrialError, ValueError):  # ValueError: "Cannot tell a FAIL trial"
        return False
    return True


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
