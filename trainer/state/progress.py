"""How far training had got: in a checkpoint (its order among others, where Lightning resumes
it) and at the end of a resumed run (did it reach what its limits ask for?).

A checkpoint's progress is what Lightning recorded in it: optimizer steps, then
micro-batches, then finished epochs (:func:`progress`). Files are ordered by it, never by
their modification time (checkpoints.py).

Lightning resumes a checkpoint written in ``on_train_epoch_end`` (tuneup's end-of-epoch
save) correctly only when training is limited by epochs. Its progress there says "epoch
processed, not completed"; with ``trainer.max_steps`` set (iteration-based training)
Lightning's fit loop always restarts, takes that state for "restarted on the epoch's end",
replays the end of the finished epoch, counts it a second time, and so skips the next
epoch without training a batch: a run resumed from such a file ended with ``status: ok``
an epoch short. (Lightning-AI/pytorch-lightning#19617 is a neighbouring case.) A
checkpoint written in ``on_train_batch_end`` of an epoch's last batch takes another path
in Lightning 2.6, "restarted mid-epoch", which trains the right batches but starts the
next epoch without its ``on_train_epoch_start`` hooks and with its ready/started epoch
counters one behind. :func:`settle_epoch_boundary` rewrites both kinds of checkpoint's
loop progress, as it is loaded (the file is not changed), into what they mean: "between
two epochs, the next one not started"; :func:`start_epoch_afresh` then has the epoch loop
start that epoch as a new one, not as the restart of the previous one, whichever limit
the run has.
"""

from __future__ import annotations

import logging
import math

log = logging.getLogger(__name__)

FIT_LOOP = "fit_loop"
EPOCHS = "epoch_progress"
BATCHES = "epoch_loop.batch_progress"
#: Per-epoch counters that a new epoch starts from zero (Lightning's ``reset_on_run``).
PER_EPOCH = (
    "epoch_loop.scheduler_progress",
    "epoch_loop.manual_optimization.optim_step_progress",
)
OPTIMIZER = "epoch_loop.automatic_optimization.optim_progress"
VALIDATION = "epoch_loop.val_loop.batch_progress"
LOGGING_STEP = "epoch_loop.state_dict"


def fit_loop(checkpoint: dict) -> dict:
    loops = checkpoint.get("loops")
    state = loops.get(FIT_LOOP) if isinstance(loops, dict) else None
    return state if isinstance(state, dict) else {}


def _count(tracker, key: str = "completed") -> int:
    value = tracker.get(key, 0) if isinstance(tracker, dict) else 0
    return value if isinstance(value, int) else 0


def progress(checkpoint: dict) -> tuple[int, int, int]:
    """(optimizer steps, micro-batches trained, epochs processed) recorded in ``checkpoint``."""
    loop = fit_loop(checkpoint)
    step = checkpoint.get("global_step", 0)
    batches = _count(loop.get(BATCHES, {}).get("total"))
    epochs = _count(loop.get(EPOCHS, {}).get("total"), "processed")
    return (step if isinstance(step, int) else 0), batches, epochs


# --------------------------------------------------------------------------------------
# a checkpoint written at an epoch's end
# --------------------------------------------------------------------------------------


def epoch_boundary(loop: dict) -> str | None:
    """Where an epoch-boundary checkpoint was written: ``"epoch_end"`` (in
    ``on_train_epoch_end``), ``"last_batch_end"`` (``on_train_batch_end`` of the epoch's last
    batch), or None (mid-epoch, or already between epochs)."""
    try:
        epochs, batches = loop[EPOCHS]["total"], loop[BATCHES]
        ready, started = epochs["ready"], epochs["started"]
        processed, completed = epochs["processed"], epochs["completed"]
        done, seen = batches["total"]["completed"], batches["total"]["processed"]
        last = batches["is_last_batch"]
    except (KeyError, TypeError):
        return None
    if ready == started == processed == completed + 1:
        return "epoch_end"
    if last and ready == started == processed + 1 == completed + 1 and done == seen - 1:
        return "last_batch_end"
    return None


def _zero(tracker: dict) -> None:
    for key, value in tracker.items():
        if isinstance(value, int) and not isinstance(value, bool):
            tracker[key] = 0


def settle_epoch_boundary(checkpoint: dict) -> bool:
    """Rewrite (in place) an epoch-boundary checkpoint's loop progress as "epoch finished,
    the next not started": what a run has between two epochs. Returns whether it did."""
    loop = fit_loop(checkpoint)
    where = epoch_boundary(loop)
    if where is None:
        return False
    epochs = loop[EPOCHS]
    for counts in (epochs["total"], epochs["current"]):
        counts["processed"] = counts["completed"] = counts["started"]
    batches = loop[BATCHES]
    if where == "last_batch_end":
        # The last batch's end hooks ran; what followed it (completed, the logging step) not.
        batches["total"]["completed"] = batches["total"]["processed"]
        stepped = loop.get(LOGGING_STEP, {})
        if isinstance(stepped.get("_batches_that_stepped"), int):
            stepped["_batches_that_stepped"] += 1
    _zero(batches["current"])
    batches["is_last_batch"] = False
    for key in PER_EPOCH:
        _zero(loop.get(key, {}).get("current", {}))
    for part in loop.get(OPTIMIZER, {}).get("optimizer", {}).values():
        _zero(part.get("current", {}))
    validation = loop.get(VALIDATION, {})
    for key in ("total", "current"):
        _zero(validation.get(key, {}))
    if "is_last_batch" in validation:
        validation["is_last_batch"] = False
    return True


def start_epoch_afresh(trainer) -> None:
    """After :func:`settle_epoch_boundary`: run the next epoch as a new one, not as the
    restart of an interrupted one. Lightning's fit loop marks itself restarting whenever
    ``max_steps`` is set; its epoch loop would then take the zeroed counters for an epoch
    that had ended. Call in ``on_train_start`` (after the fit loop's reset, before the epoch
    loop's)."""
    epoch_loop = trainer.fit_loop.epoch_loop
    epoch_loop.restarting = False  # and its validation and optimization loops
    epoch_loop.reset_restart_stage()
    epoch_loop.val_loop.reset_restart_stage()


def continue_epoch(trainer, left: int) -> tuple[int, int, int]:
    """After a mid-epoch checkpoint restored in another layout (trainer/state/data_order.py
    ``restore_data_order``): count the epoch's micro-batches so far as this run's epoch
    length less the ``left`` ones still to come. Call in ``on_train_start``, before the epoch
    loop's reset.

    Lightning ends an epoch, and validates at its end, when its count of the epoch's
    micro-batches reaches the epoch's length (``num_training_batches``, from the loader's
    length); the restored count is the old layout's, so with 2 processes resumed on 1 the
    epoch would end half-way, or the last batch would not be taken for the last. The count
    also places the accumulation windows (a step where it is a multiple of k): they fall on
    this run's grid of the epoch, as if it had trained the epoch from its start.

    Returns where training starts (optimizer step, epoch, micro-batches of it done) for
    :func:`shortfall`: the steps before were taken at the old global batch.
    """
    length = trainer.num_training_batches
    current = trainer.fit_loop.epoch_loop.batch_progress.current
    if math.isfinite(length):
        shift = max(0, int(length) - left) - current.ready
        for key in ("ready", "started", "processed", "completed"):
            setattr(current, key, getattr(current, key) + shift)
    return trainer.global_step, trainer.current_epoch, current.ready


# --------------------------------------------------------------------------------------
# the end of a resumed run
# --------------------------------------------------------------------------------------


def epochs_done(checkpoint: dict) -> int:
    """Epochs trained to their end in ``checkpoint``: those processed, and the epoch whose
    last batch it was written after (Lightning counts that one only after the batch)."""
    epochs = progress(checkpoint)[2]
    return epochs + 1 if epoch_boundary(fit_loop(checkpoint)) == "last_batch_end" else epochs


def limit_reached(checkpoint: dict, max_steps, max_epochs) -> tuple[str, int] | None:
    """The limit (``("trainer.max_steps", 24)``) that ``checkpoint`` has reached already,
    so that a run resumed from it with these limits would train nothing; None if none."""
    steps = progress(checkpoint)[0]
    if isinstance(max_steps, int) and max_steps > 0 and steps >= max_steps:
        return "trainer.max_steps", max_steps
    if isinstance(max_epochs, int) and max_epochs > 0 and epochs_done(checkpoint) >= max_epochs:
        return "trainer.max_epochs", max_epochs
    return None


def steps_asked(trainer, start: tuple[int, int, int] | None = None) -> tuple[int, str] | None:
    """The optimizer steps the run's limits ask for, and which limits say so; None when
    they cannot be known (no limit, or an epoch of unknown length).

    ``start``: where a run resumed mid-epoch in another layout started (optimizer step,
    epoch, micro-batches of it done on this run's grid: :func:`continue_epoch`). The steps
    before it count as they were taken, at the old global batch; the epochs from there at
    this run's steps per epoch."""
    asked = []
    if trainer.max_steps is not None and trainer.max_steps >= 0:
        asked.append((trainer.max_steps, f"trainer.max_steps={trainer.max_steps}"))
    epochs, batches = trainer.max_epochs, trainer.num_training_batches
    if epochs is not None and epochs >= 0 and math.isfinite(batches):
        k = trainer.accumulate_grad_batches
        per_epoch = math.ceil(batches / k)
        step, epoch, done = start or (0, 0, 0)
        text = f"trainer.max_epochs={epochs} x {per_epoch} steps per epoch"
        if step:
            text += f" (from step {step}, {done} micro-batches into epoch {epoch})"
        done_steps = per_epoch if done >= batches else done // k
        asked.append((step + (epochs - epoch) * per_epoch - done_steps, text))
    return min(asked) if asked else None


def shortfall(trainer, start: tuple[int, int, int] | None = None) -> str | None:
    """Why a finished run has fewer optimizer steps than its limits ask for; None if it has
    them all (``start``: see :func:`steps_asked`). Logged as a warning too: a resumed run
    must not end short without a word."""
    asked = steps_asked(trainer, start)
    if asked is None or trainer.global_step >= asked[0]:
        return None
    steps, limit = asked
    if trainer.interrupted:
        reason = "the run was interrupted"
    elif trainer.should_stop:
        reason = "a callback or plugin stopped it (trainer.should_stop, e.g. early stopping)"
    else:
        reason = (
            f"the training loop counted {trainer.current_epoch} epochs done at step "
            f"{trainer.global_step}: the epochs and steps recorded in the checkpoint disagree "
            "with this run's steps per epoch (other data, batch size or accumulation?)"
        )
    text = f"stopped after {trainer.global_step} of the {steps} optimizer steps that {limit} "
    text += f"ask for: {reason}"
    log.warning("%s", text)
    return text
