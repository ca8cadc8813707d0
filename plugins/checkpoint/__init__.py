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
and it cannot be asked to save now, on a signal. The ``Saver`` callback (saver.py) saves
instead, through ``trainer.save_checkpoint``: the checkpoint's contents are Lightning's own.

This module holds the plugin: the settings' checks, the callback and the ``CheckpointIO``
it gives the Trainer, and the summary's ``checkpoints``; saver.py when and how a save happens.
"""

from __future__ import annotations

from tuneup import hookimpl
from tuneup.plugins.checkpoint.saver import Saver
from tuneup.trainer.state.async_save import BackgroundWriter
from tuneup.trainer.state.checkpoint_io import AtomicCheckpointIO
from tuneup.trainer.state.checkpoints import SUPERSEDED, damaged
from tuneup.trainer.state.hf_export import export_problems
from tuneup.trainer.state.resume import checkpoint_dir
from tuneup.trainer.validation import BOOL, Integer, Number, OneOf, problem, problems

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
