"""What ``resume=`` means: which checkpoint a run continues from, and whether it can continue exactly.

``resume=null`` (default) starts fresh; a run directory that already holds
checkpoints is refused, so a requeued job that forgot ``resume=auto`` does not
silently start over next to them. ``resume=auto`` continues from the newest
valid checkpoint in ``<run dir>/checkpoints`` (skipping unreadable ones with
a warning; starting fresh only when there is none yet). ``resume=<path>``
continues from that file.

Every checkpoint records the settings that decide how training proceeds
(:func:`run_facts`, under ``checkpoint["tuneup_run"]``); a resumed run with
different ones gets a warning listing each, and an error where the rest of an
interrupted epoch cannot be laid out as it was. Everything read back is data:
nothing from a checkpoint is ever instantiated or imported.
"""

from __future__ import annotations

import logging
from pathlib import Path

from omegaconf import OmegaConf

from tuneup import TuneupError
from tuneup.trainer.state.checkpoint_io import list_checkpoints, load, newest_valid

log = logging.getLogger(__name__)

#: Checkpoints live in ``<run dir>/checkpoints``.
CHECKPOINT_DIR = "checkpoints"
#: Keys of tuneup's own entries in a Lightning checkpoint.
RUN_KEY = "tuneup_run"
RNG_KEY = "tuneup_rng"
ORDER_KEY = "tuneup_data_order"
#: Settings that change how a resumed run trains; compared on resume.
WATCHED = ("precision", "grad_accum", "data.batch_size", "world_size", "seed", "data.name")
#: Settings that decide which samples make up the rest of an interrupted epoch.
EPOCH_LAYOUT = ("data.batch_size", "world_size")


def checkpoint_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / CHECKPOINT_DIR


def resolve(resume, run_dir: str | Path) -> tuple[Path, dict] | None:
    """The checkpoint ``resume`` names and its contents (tensors memory-mapped), or None: fresh."""
    directory = checkpoint_dir(run_dir)
    if resume is None:
        existing = list_checkpoints(directory)
        if existing:
            raise TuneupError(
                f"resume=null (start fresh) but {directory} already holds {len(existing)} "
                f"checkpoint(s) (newest: {existing[0].name}). Continue that run with "
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
    if path.is_dir():
        raise TuneupError(
            f"resume={resume!r} is a directory; give a .ckpt file in it, or resume=auto with "
            "hydra.run.dir set to the run directory"
        )
    return path, load(path, mmap=True)


def run_facts(cfg, trainer, data_order: dict | None = None) -> dict:
    """The watched settings of this run, plain values only, and how far into its epoch it is."""
    state = data_order or {}
    return {
        "precision": OmegaConf.select(cfg, "precision.name", default="fp32"),
        "grad_accum": int(trainer.accumulate_grad_batches),
        "data.batch_size": int(cfg.data.batch_size),
        "world_size": int(trainer.world_size),
        "seed": int(cfg.seed),
        "data.name": str(cfg.data.name),
        "epoch_position": int(state.get("position", 0)),  # samples of this rank's share
    }


def config_changes(saved: dict, current: dict) -> tuple[list[str], list[str]]:
    """(changes that only warrant a warning, changes that make resuming incorrect)."""
    changed = [k for k in WATCHED if k in saved and saved[k] != current[k]]
    position = saved.get("epoch_position", 0)
    errors = []
    if position:
        errors = [k for k in changed if k in EPOCH_LAYOUT]
        batches = position // saved.get("data.batch_size", 1)
        if "grad_accum" in changed and batches % current["grad_accum"]:
            errors.append("grad_accum")
    lines = {k: f"{k}: {saved[k]!r} -> {current[k]!r}" for k in changed}
    return [lines[k] for k in changed if k not in errors], [lines[k] for k in errors]


def check_config(path: Path, checkpoint: dict, cfg, trainer) -> None:
    """Warn about every watched setting that changed since ``checkpoint``; raise where it must not."""
    saved = checkpoint.get(RUN_KEY)
    if not isinstance(saved, dict):
        log.warning(
            "%s has no tuneup run settings; config changes since it cannot be checked", path
        )
        return
    warn, fail = config_changes(saved, run_facts(cfg, trainer))
    if fail:
        position = saved.get("epoch_position", 0)
        raise TuneupError(
            f"cannot resume {path} exactly: it stopped {position} samples into an epoch, and "
            f"the rest of that epoch depends on settings that changed ({'; '.join(fail)}). "
            "Resume with the old values, or from a checkpoint saved at an epoch end"
        )
    if warn:
        note = ""
        if any(line.startswith("seed:") for line in warn):
            note = " (the checkpoint's random states and data order continue; seed has no effect)"
        log.warning("resuming %s with changed settings%s: %s", path, note, "; ".join(warn))
