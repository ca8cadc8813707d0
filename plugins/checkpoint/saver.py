"""The checkpoint callback: when to save, the save itself, pruning, and the stop on a signal.

:class:`Saver` is a Lightning ``Checkpoint`` callback (so Lightning runs it after the other
callbacks, with their state final, and adds no default ModelCheckpoint) that calls
``trainer.save_checkpoint``: the checkpoint's contents are Lightning's own. It saves only
where an optimizer step has just finished, so a checkpoint never holds half an accumulation
window; every rank decides alike (:func:`agreed`), as saving is collective. The settings'
checks and the plugin's hooks are in this package's ``__init__``.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch
from pytorch_lightning.callbacks import Checkpoint

from tuneup.trainer.state.async_save import BackgroundWriter
from tuneup.trainer.state.checkpoint_space import next_checkpoint_bytes, space_warning
from tuneup.trainer.state.checkpoints import (
    BEST,
    checkpoint_name,
    prune,
    remove_leftover_temporaries,
    set_aside_newer,
    set_aside_skipped,
)
from tuneup.trainer.state.hf_export import EXPORT_DIR, export
from tuneup.trainer.state.preemption import SignalFlag, stopped

log = logging.getLogger(__name__)


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


def log_step(trainer) -> None:
    """Write the current step's metrics (a logging step's) to the loggers now, as Lightning
    would after ``on_train_batch_end``: a run stopped there by a signal would otherwise lose
    the row of the very step it saved, which the resumed run does not train again. The rows
    before it are written already; Lightning finalizes (flushes) the loggers as the run
    ends on the exception."""
    trainer._logger_connector.update_train_step_metrics()
