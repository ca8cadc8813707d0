"""What ``resume=`` means: which checkpoint a run continues from, and whether it can.

``resume=null`` (default) starts fresh; a run directory that already holds
checkpoints is refused, so a requeued job that forgot ``resume=auto`` does not
silently start over next to them. ``resume=auto`` continues from the newest
valid checkpoint in ``<run dir>/checkpoints`` (the furthest trained; skipping
unreadable or corrupt ones with a warning; starting fresh only when there is none
yet). ``resume=<path>`` continues from that file.

``resume_weights_only=true`` (with ``resume=<path>``) starts a *new* run from the
file's model weights only: optimizer, schedule, data order, random states and step
count start afresh, so any setting may change except the model's shapes. It needs a
run directory without checkpoints of its own: a new run's steps would otherwise be
ordered among the old run's. (``resume`` stays a plain string rather than a node with
``resume.weights_only``, so that ``resume=auto`` and ``resume=<path>`` keep working on
the command line: Hydra cannot hold a value and a node under one key.)

Every checkpoint records the run's settings (:func:`run_facts`, under
``checkpoint["tuneup_run"]``, with the whole config); a resumed run lists every
setting that changed and what it does, or refuses (trainer/state/changes.py).
Everything read back is data: nothing from a checkpoint is ever instantiated or imported.
"""

from __future__ import annotations

import logging
from pathlib import Path

from omegaconf import OmegaConf

from tuneup.errors import TuneupError
from tuneup.trainer.state import changes
from tuneup.trainer.state.checkpoint_read import UnreadableCheckpoint, load
from tuneup.trainer.state.checkpoints import checkpoint_files, intact_beside, newest_valid
from tuneup.trainer.state.data_order import data_shard
from tuneup.trainer.state.progress import epochs_done, limit_reached, progress

log = logging.getLogger(__name__)

#: Checkpoints live in ``<run dir>/checkpoints``.
CHECKPOINT_DIR = "checkpoints"
#: Keys of tuneup's own entries in a Lightning checkpoint.
RUN_KEY = "tuneup_run"
RNG_KEY = "tuneup_rng"
ORDER_KEY = "tuneup_data_order"


def checkpoint_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / CHECKPOINT_DIR


def resolve(resume, run_dir: str | Path, weights_only: bool = False) -> tuple[Path, dict] | None:
    """The checkpoint ``resume`` names and its contents (tensors memory-mapped), or None: fresh."""
    directory = checkpoint_dir(run_dir)
    existing = checkpoint_files(directory)
    if weights_only:
        _check_weights_only(resume, directory, existing)
    if resume is None:
        if existing:
            raise TuneupError(
                f"resume=null (start fresh) but {directory} already holds {len(existing)} "
                f"checkpoint(s) (e.g. {existing[-1].name}). Continue that run with "
                "resume=auto, or start fresh in another directory (hydra.run.dir=...)"
            )
        return None
    if resume == "auto":
        found = newest_valid(directory)
        if found is None:
            log.info("resume=auto: no checkpoint in %s yet; starting from the beginning", directory)
        return found
    path = Path(str(resume)).expanduser()
    if not path.exists():
        raise TuneupError(
            f"resume={resume!r}: no such file. Give a .ckpt file, resume=auto (the newest in "
            f"{directory}) or resume=null (start fresh)"
        )
    if path.is_dir() and not (path / ".metadata").is_file():  # DCP's index: a sharded one
        raise TuneupError(
            f"resume={resume!r} is a directory, not a checkpoint; give a .ckpt file or "
            "directory in it, or resume=auto with hydra.run.dir set to the run directory"
        )
    try:
        return path, load(path, mmap=True)
    except UnreadableCheckpoint as exc:  # what is wrong, then what to do about it
        raise UnreadableCheckpoint(f"{exc}{_instead(path, directory)}") from None


def _instead(path: Path, directory: Path) -> str:
    """The intact checkpoints beside a damaged ``resume=<path>``, and how to continue."""
    intact = intact_beside(path)
    if not intact:
        return f"; no intact checkpoint beside it in {path.parent}"
    listed = ", ".join(f"{p.name} (step {step})" for p, step in intact)
    text = f". Intact beside it, newest first: {listed}; continue with resume={intact[0][0]}"
    if path.parent.resolve() == directory.resolve():
        return text + " or resume=auto (the newest intact one)"
    if path.parent.name == CHECKPOINT_DIR:  # another run's: auto in that run's directory
        return text + (
            f", or resume=auto hydra.run.dir={path.parent.parent} (that run, in "
            "place, from its newest intact one)"
        )
    return text


def complete(cfg, run_dir: str | Path, path: Path, checkpoint: dict) -> str | None:
    """What to say when ``checkpoint`` has reached this run's limits already (a finished run
    resumed as it was): resuming would train nothing and only rewrite the run's summary and
    metrics, so the run is left as it is. None when there is training left to do."""
    trainer = cfg.get("trainer") or {}
    reached = limit_reached(checkpoint, trainer.get("max_steps"), trainer.get("max_epochs"))
    if reached is None:
        return None
    key, value = reached
    epochs = epochs_done(checkpoint)
    return (
        f"the run is complete: {path.name} already reached {key}={value} (step "
        f"{progress(checkpoint)[0]}, {epochs} epoch{'' if epochs == 1 else 's'}), so nothing "
        f"was trained and {run_dir} is left as it was. To train further, raise {key}, e.g. "
        f"{key}={2 * value} resume={cfg.get('resume')}"
    )


def weights_only_setting(cfg) -> bool:
    """``resume_weights_only``, checked: true or false."""
    value = cfg.get("resume_weights_only", False)
    if not isinstance(value, bool):
        raise TuneupError(
            f"resume_weights_only={value!r} is not allowed: expected true or false (true: a new "
            "run from the weights of resume=<path>, nothing else)"
        )
    return value


def _check_weights_only(resume, directory: Path, existing: list[Path]) -> None:
    if resume in (None, "auto"):
        raise TuneupError(
            f"resume_weights_only=true needs resume=<path of a .ckpt file> (got resume={resume!r}): "
            "a new run starts from that file's weights; resume=auto continues this directory's "
            "own run, with everything"
        )
    if existing:
        raise TuneupError(
            f"resume_weights_only=true starts a new run, but {directory} already holds "
            f"{len(existing)} checkpoint(s) (e.g. {existing[-1].name}): continue that run with "
            "resume=auto (without resume_weights_only), or give this run another directory "
            "(hydra.run.dir=...)"
        )


def run_facts(cfg, trainer, data_order: dict | None = None) -> dict:
    """This run's settings, plain values only, and how far into its epoch it is."""
    state = data_order or {}
    return {
        "config": changes.snapshot(cfg),
        "precision": OmegaConf.select(cfg, "precision.name", default="fp32"),
        "grad_accum": int(trainer.accumulate_grad_batches),
        "data.batch_size": cfg.data.get("batch_size"),
        "world_size": int(trainer.world_size),
        "data_shards": data_shard(trainer)[1],  # the world less tensor parallelism's groups
        "seed": int(cfg.seed),
        "data.name": str(cfg.data.get("name") or cfg.data.get("_target_")),  # a user's: its target
        "optimizers": [type(o).__name__ for o in getattr(trainer, "optimizers", None) or []],
        "epoch_position": int(state.get("position", 0)),  # samples of this rank's share
    }


def weights_problem(module, checkpoint: dict) -> str | None:
    """Why ``checkpoint``'s weights do not load into ``module`` (names, shapes); None if they do."""
    saved, now = checkpoint.get("state_dict"), module.state_dict()
    if not isinstance(saved, dict):
        return "the checkpoint holds no model weights"
    missing, extra = sorted(set(now) - set(saved)), sorted(set(saved) - set(now))
    if missing or extra:
        parts = [f"{len(missing)} missing, e.g. {missing[0]}"] if missing else []
        parts += [f"{len(extra)} not in the model, e.g. {extra[0]}"] if extra else []
        return "weights " + "; ".join(parts)
    for name, tensor in now.items():
        shape = getattr(saved[name], "shape", None)
        if shape is not None and tuple(shape) != tuple(tensor.shape):
            return f"{name} is {list(shape)} in the checkpoint, {list(tensor.shape)} now"
    return None


def check_config(
    path: Path, checkpoint: dict, cfg, trainer, module, *, owns_optimizer: bool
) -> None:
    """Warn about every setting that changed since ``checkpoint`` and what it does; raise
    TuneupError, naming each, where the checkpoint cannot continue under the change.
    ``owns_optimizer``: tuneup built the optimizer from the config (its TrainingModule, not a
    user's LightningModule), so changed ``optimizer.*``/``scheduler.*`` settings apply."""
    saved = checkpoint.get(RUN_KEY)
    problem = weights_problem(module, checkpoint)
    if not isinstance(saved, dict):
        log.warning(
            "%s has no tuneup run settings; config changes since it cannot be checked", path
        )
        saved = {}
    step = checkpoint.get("global_step", 0)
    context = changes.Context(
        step=step if isinstance(step, int) else 0,
        position=_int(saved.get("epoch_position")),
        saved=saved,
        current=run_facts(cfg, trainer),
        weights_problem=problem,
        owns_optimizer=owns_optimizer,
        order=checkpoint.get(ORDER_KEY) if isinstance(checkpoint.get(ORDER_KEY), dict) else None,
    )
    changes.report(path, changes.review(context))


def _int(value) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def load_weights(path: Path, checkpoint: dict, module, mode: str = "fit") -> None:
    """``resume_weights_only=true`` (or ``mode=validate|test|predict``): the checkpoint's model
    weights into ``module``, nothing else."""
    problem = weights_problem(module, checkpoint)
    if problem:
        setting = "resume_weights_only=true" if mode == "fit" else f"mode={mode}"
        raise TuneupError(
            f"{setting}: the weights of {path} do not fit the model built now "
            f"({problem}); build the model as it was (the model.* settings of that run)"
        )
    module.load_state_dict(checkpoint["state_dict"])
    if mode != "fit":
        log.info("mode=%s: the weights of %s; nothing is trained", mode, path)
        return
    log.info(
        "starting a new run from the weights of %s (optimizer, schedule, data order and "
        "step count start afresh)",
        path,
    )
