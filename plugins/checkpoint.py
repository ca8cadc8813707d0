"""Checkpoints while training, and on preemption: ``checkpoint=on`` (default) | ``off``.

Writes ``<run dir>/checkpoints/epochEEE-stepSSSSSSSS.ckpt`` every
``every_n_steps`` optimizer steps, every ``every_n_minutes``, every
``every_n_epochs`` epochs and at the end of training, keeps the ``keep_last``
furthest trained, and with ``monitor`` also ``best.ckpt``. SIGTERM or SIGUSR1 during
training: the current optimizer step finishes, a checkpoint is written and the
run exits with :data:`trainer.state.preemption.EXIT_CODE`. ``resume=auto`` continues
from the furthest trained (trainer/state/resume.py). Files are written atomically with a
checksum, and read back safely and verified; "newest" and pruning go by the training
progress recorded in the files, never their times (trainer/state/checkpoints.py). With
``async=true`` the state is copied and written in the background while training goes on,
pruning after the new checkpoint is complete (trainer/state/async_save.py). See
docs/checkpointing.md.

When training starts (rank 0; after the checkpoint is restored, which under ``strategy=fsdp``
is after ``on_fit_start``): the files ``resume=auto`` skipped as damaged are set aside
into ``checkpoints/damaged/`` (never counted, never pruned, named in the summary), and after
``resume=<path>`` of an older checkpoint the further-trained ones into
``checkpoints/superseded/`` (likewise, said on the console); the
directory is pruned to ``keep_last`` before the first save, so lowering ``keep_last`` on
resume frees space before it is needed; and a warning says so when the file system has
less free space than the next checkpoint will take.

Saves happen only where an optimizer step has just finished: a checkpoint
never holds half an accumulation window (the gradients of its first
micro-batches are not in a checkpoint), so with ``grad_accum.steps=k`` a
signal arriving mid-window is acted on at the window's end.

Lightning's ``ModelCheckpoint`` is not used: its ``every_n_train_steps``,
``train_time_interval`` and ``every_n_epochs`` exclude each other, it keeps
"the last K" only by monitoring a metric (``save_top_k`` > 1 needs ``monitor``),
and it cannot be asked to save now, on a signal. :class:`Saver` is a Lightning
``Checkpoint`` callback (so Lightning runs it after the other callbacks, with
their state final, and adds no default ModelCheckpoint) that calls
``trainer.save_checkpoint``: the checkpoint's contents are Lightning's own.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch
from pytorch_lightning.callbacks import Checkpoint

from tuneup import hookimpl
from tuneup.trainer.state.async_save import BackgroundWriter
from tuneup.trainer.state.checkpoint_io import AtomicCheckpointIO
from tuneup.trainer.state.checkpoint_space import next_checkpoint_bytes, space_warning
from tuneup.trainer.state.checkpoints import (
    BEST,
    SUPERSEDED,
    checkpoint_name,
    damaged,
    prune,
    remove_leftover_temporaries,
    set_aside_newer,
    set_aside_skipped,
)
from tuneup.trainer.state.hf_export import EXPORT_DIR, export, export_problems
from tuneup.trainer.state.preemption import SignalFlag, stopped
from tuneup.trainer.state.resume import checkpoint_dir
from tuneup.trainer.validation import BOOL, Integer, Number, OneOf, problem, problems

log = logging.getLogger(__name__)

RULES = {
    "checkpoint.every_n_steps": Integer(low=1, also=(None,), note="null: not by steps"),
    "checkpoint.every_n_epochs": Integer(low=0, also=(None,), note="0 or null: not at epoch ends"),
    "checkpoint.keep_last": Integer(low=1, also=(None,), note="null: keep all"),
    "checkpoint.mode": OneOf(("max", "min")),
    "checkpoint.export": OneOf(("none", "hf")),
    "checkpoint.async": BOOL,
}
KEYS = (
    "plugin",
    "every_n_steps",
    "every_n_minutes",
    "every_n_epochs",
    "keep_last",
    "monitor",
    "mode",
    "async",
    "export",
)


def settings_problems(cfg) -> list[str]:
    """Problems with ``cfg.checkpoint``: unknown keys, bad values, a conflicting Trainer flag."""
    node = cfg.checkpoint
    found = [
        f"checkpoint.{key} is not a checkpoint setting; allowed: {', '.join(KEYS[1:])}"
        for key in node
        if key not in KEYS
    ]
    found += problems(cfg, RULES)
    minutes = node.get("every_n_minutes")
    if minutes is not None and not Number(gt=0)(minutes):
        found.append(problem("checkpoint.every_n_minutes", minutes, "a number > 0 or null"))
    monitor = node.get("monitor")
    if monitor is not None and not isinstance(monitor, str):
        found.append(problem("checkpoint.monitor", monitor, "a logged metric (val/acc) or null"))
    if cfg.trainer.get("enable_checkpointing") is False:
        found.append(
            "trainer.enable_checkpointing=false contradicts checkpoint=on; to write no "
            "checkpoints choose checkpoint=off"
        )
    return found


def agreed(trainer, *flags: bool) -> list[bool]:
    """Each flag, true if it is true on any rank. Saving is collective, so all ranks must decide
    alike; signals and clocks differ between them. One tiny all-reduce per optimizer step under
    DDP (Lightning itself broadcasts its SIGTERM flag every batch); none in one process."""
    if trainer.world_size == 1:
        return list(flags)
    votes = torch.tensor(flags, dtype=torch.int32, device=trainer.strategy.root_device)
    torch.distributed.all_reduce(votes, op=torch.distributed.ReduceOp.MAX)
    return [bool(v) for v in votes.tolist()]


def is_better(value: float, best: float | None, mode: str) -> bool:
    return best is None or (value > best if mode == "max" else value < best)


class Saver(Checkpoint):
    """Decides when to save, saves through ``trainer.save_checkpoint``, prunes, acts on signals."""

    def __init__(
        self, settings, directory: Path, resumed_auto: bool = False, resumed_path: bool = False
    ) -> None:
        self.resumed_auto = resumed_auto  # resume=auto: what it skipped is set aside at start
        self.resumed_path = resumed_path  # resume=<path>: what is newer is set aside at start
        self.every_n_steps = settings.get("every_n_steps")
        minutes = settings.get("every_n_minutes")
        self.every_n_seconds = minutes * 60 if minutes else None
        self.every_n_epochs = settings.get("every_n_epochs")
        self.keep_last = settings.get("keep_last")
        self.monitor, self.mode = settings.get("monitor"), settings.get("mode", "max")
        self.directory = directory
        self.signals = SignalFlag()
        self.best: float | None = None  # the monitored metric of best.ckpt (in the checkpoint)
        self.saved_step: int | None = None  # global step of the newest resumable checkpoint
        self.seen_step = 0
        self.last_save = time.monotonic()
        self.written, self.save_seconds, self.last_path = 0, 0.0, None
        self._warned_monitor = False
        self.export, self.exported = settings.get("export", "none"), None  # checkpoint.export=hf
        #: Where saves finish under checkpoint.async=true (the Plugin gives it to the
        #: CheckpointIO); unused otherwise, and then what follows a save happens at once.
        self.writer = BackgroundWriter()
        self.asynchronous = bool(settings.get("async"))

    @property
    def state_key(self) -> str:
        return "tuneup_checkpoint"  # stable, whatever the settings (Lightning keys state by it)

    def state_dict(self) -> dict:
        return {"best": self.best}

    def load_state_dict(self, state: dict) -> None:
        self.best = state.get("best")

    # -- when -----------------------------------------------------------------------------

    def on_fit_start(self, trainer, pl_module) -> None:
        self.signals.remember_handlers()  # the ones from before Lightning installs its own

    def tidy(self, resumed: Path | None, module) -> None:
        """Before the first save (rank 0): damaged files aside (and after resume=<path>, those
        further trained), the directory pruned to ``keep_last`` (a lowered one frees its
        space now), a warning if the next save cannot fit."""
        if self.resumed_auto and resumed is not None:
            set_aside_skipped(self.directory, resumed)
        if self.resumed_path and resumed is not None:
            set_aside_newer(self.directory, resumed)
        if self.keep_last:
            for path in prune(self.directory, self.keep_last, protect=resumed):
                log.info("removed %s: checkpoint.keep_last=%d", path.name, self.keep_last)
        warning = space_warning(self.directory, *next_checkpoint_bytes(resumed, module))
        if warning:
            log.warning("%s", warning)

    def on_train_start(self, trainer, pl_module) -> None:
        # After the run-state callback's (a checkpoint callback's hooks run last): the resume
        # was accepted, so a refused one leaves even a killed save's leftovers as they were.
        if trainer.is_global_zero:
            for path in remove_leftover_temporaries(self.directory):
                log.info("removed %s, left by a save that was killed", path.name)
        # After Lightning installed its SIGTERM handler (which would only stop at the epoch end,
        # and under DDP kill the other processes before they save): the signals are ours now.
        self.signals.install()
        if getattr(trainer, "received_sigterm", False):
            self.signals.received = "SIGTERM"  # arrived while Lightning's handler was in place
        self.seen_step = trainer.global_step
        # The step resumed from is on disk here already, unless it came from elsewhere
        # (resume=<path> in another directory, or best.ckpt): then the end is saved here too.
        resumed = trainer.ckpt_path  # known only now under strategy=fsdp (restored after setup)
        if trainer.is_global_zero:
            self.tidy(Path(resumed) if resumed else None, pl_module)
        here = resumed is None or (
            Path(resumed).parent.resolve() == self.directory.resolve()
            and Path(resumed).name != BEST
        )
        self.saved_step = trainer.global_step if here else None
        self.last_save = time.monotonic()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        stepped, self.seen_step = step != self.seen_step, step
        if not stepped:
            return  # inside an accumulation window
        every = self.every_n_seconds
        timed = bool(every) and time.monotonic() - self.last_save >= every
        preempted, timed = agreed(trainer, self.signals.received is not None, timed)
        if preempted or timed or self._step_due(trainer, step):
            self.save(trainer)
        if preempted:
            self.settle()  # the checkpoint complete on disk before the run exits
            log_step(trainer)
            received = self.signals.received or "a stop signal on another rank"
            raise stopped(received, step, self.last_path, self.directory.parent)

    def _step_due(self, trainer, step: int) -> bool:
        if self.every_n_steps and step % self.every_n_steps == 0:
            return True
        return trainer.max_steps > 0 and step >= trainer.max_steps  # the final weights on disk

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        epoch, last = trainer.current_epoch, trainer.max_epochs
        final = last is not None and last >= 0 and epoch + 1 >= last
        if final or (self.every_n_epochs and (epoch + 1) % self.every_n_epochs == 0):
            self.save(trainer)

    def on_validation_end(self, trainer, pl_module) -> None:
        if not self.monitor or trainer.sanity_checking:
            return
        value = trainer.callback_metrics.get(self.monitor)
        if value is None:
            if not self._warned_monitor:
                known = ", ".join(sorted(trainer.callback_metrics)) or "none yet"
                log.warning(
                    "checkpoint.monitor=%s is not a logged metric (logged: %s); no %s",
                    self.monitor,
                    known,
                    BEST,
                )
                self._warned_monitor = True
            return
        if is_better(float(value), self.best, self.mode):
            self.best = float(value)
            self.save(trainer, self.directory / BEST)

    def on_train_end(self, trainer, pl_module) -> None:
        self.save(trainer)  # the final weights, unless a save at this step happened already
        self.settle()
        if self.export == "hf":  # for from_pretrained; every rank writes its part
            model = getattr(pl_module, "model", pl_module)
            self.exported = export(trainer, model, self.directory.parent / EXPORT_DIR)

    def on_fit_end(self, trainer, pl_module) -> None:
        self.signals.restore()

    def on_exception(self, trainer, pl_module, exception) -> None:
        self.signals.restore()
        try:
            self.settle()  # a save in flight completes (or fails) before the run ends
        except Exception as error:  # the exception being raised is the one to report
            log.error("the checkpoint being written in the background failed too: %s", error)

    # -- how ------------------------------------------------------------------------------

    def save(self, trainer, path: Path | None = None) -> None:
        """Save (on every rank: the state is gathered collectively); rank 0 writes and prunes."""
        resumable = path is None
        if resumable:
            if self.saved_step == trainer.global_step:
                return  # saved at this step already (or resumed from it)
            path = self.directory / checkpoint_name(trainer.current_epoch, trainer.global_step)
        self.settle()  # the save in flight first (its error, if it failed, raised here)
        started = time.perf_counter()
        trainer.save_checkpoint(path, weights_only=False)  # False: the full state, not weights only
        self.save_seconds += time.perf_counter() - started
        self.written += 1
        if resumable:
            self.saved_step, self.last_path = trainer.global_step, path
            self.last_save = time.monotonic()
            if self.keep_last and trainer.is_global_zero:  # once the new checkpoint is complete
                self.writer.then(prune, self.directory, self.keep_last)

    def settle(self) -> None:
        """Wait for the save in flight (``checkpoint.async=true``); the wait counts as save time."""
        started = time.perf_counter()
        self.writer.wait()
        self.save_seconds += time.perf_counter() - started


def background_figures(writer: BackgroundWriter) -> dict:
    """``checkpoint.async=true``: of ``save_seconds``, the waits for a previous save and the
    copying of the state; and how long the background writes took."""
    return {
        "async": True,
        "wait_seconds": round(writer.waited_s, 3),
        "staging_seconds": round(writer.staged_s, 3),
        "background_seconds": round(writer.written_s, 3),
    }


class Plugin:
    def __init__(self, cfg) -> None:
        self.settings = cfg.checkpoint
        self.resumed_auto = cfg.get("resume") == "auto" and not cfg.get("resume_weights_only")
        self.resumed_path = cfg.get("resume") not in (None, "auto") and not cfg.get(
            "resume_weights_only"
        )
        self.saver: Saver | None = None

    @hookimpl
    def check(self, cfg, plan):
        return settings_problems(cfg) + export_problems(cfg, plan)

    @hookimpl
    def configure_trainer(self, kwargs):
        directory = checkpoint_dir(kwargs["default_root_dir"])
        self.saver = Saver(
            self.settings, directory, resumed_auto=self.resumed_auto, resumed_path=self.resumed_path
        )
        kwargs["callbacks"].append(self.saver)
        kwargs["enable_checkpointing"] = True  # the Saver is the checkpoint callback, no default
        io = AtomicCheckpointIO(self.saver.writer if self.saver.asynchronous else None)
        kwargs["plugins"] = [*(kwargs.get("plugins") or []), io]

    @hookimpl
    def report(self, summary):
        saver = self.saver
        if saver is None:
            return
        summary["checkpoints"] = {
            "written": saver.written,
            "last": str(saver.last_path) if saver.last_path else None,
            "save_seconds": round(saver.save_seconds, 3),  # training stood still this long
            **(background_figures(saver.writer) if saver.asynchronous else {}),
            "preempted_by": saver.signals.received,
            "best": saver.best,
            "export": str(saver.exported) if saver.exported else None,  # checkpoint.export=hf
            "damaged": [str(p) for p in damaged(saver.directory)],  # set aside, kept
            "superseded": [str(p) for p in damaged(saver.directory, SUPERSEDED)],  # likewise
        }


def log_step(trainer) -> None:
    """Write the current step's metrics (a logging step's) to the loggers now, as Lightning
    would after ``on_train_batch_end``: a run stopped there by a signal would otherwise lose
    the row of the very step it saved, which the resumed run does not train again. The rows
    before it are written already; Lightning finalizes (flushes) the loggers as the run
    ends on the exception."""
    trainer._logger_connector.update_train_step_metrics()
