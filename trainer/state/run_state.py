"""The run-state callback: what exact resume and a safe stop need, for any LightningModule.

Added to every run's Trainer by the runner (it is core, not a plugin), whether the model
is trained by tuneup's TrainingModule or is the user's own LightningModule:

- checkpoints get every rank's RNG states (:mod:`.rng`), the training data order
  (:mod:`.data_order`) and the run's settings (:func:`.resume.run_facts`); on resume they
  come back when training starts, after everything that runs between loading and the first
  batch (setup, dataloaders, a sanity check), so those cannot shift the resumed stream;
- on resume, a checkpoint written at an epoch's end starts the next epoch as a new one
  (:mod:`.progress`: Lightning would skip it when ``max_steps`` is set), one written
  mid-epoch and resumed on another number of data shards or batch size has the rest of its
  epoch dealt anew and counted in the new layout's micro-batches, and the config's
  optimizer settings replace the saved ones (:mod:`.changes`), checked first: an optimizer
  state that does not fit this run's optimizer is refused, not loaded into a ``KeyError``;
- a NaN/inf loss stops the run (:mod:`.divergence`): checked at once on one CPU process,
  else at the logging interval, and before every checkpoint, which is never written with
  non-finite weights;
- once all that is done, training starts from the restored state: the run takes its
  directory (``on_start``), so that a resume refused before then changed nothing there;
- it notes the step of the last validation, so the runner validates the final weights
  when a run ended between validations.
"""

from __future__ import annotations

import pytorch_lightning as pl

from tuneup.errors import TuneupError
from tuneup.trainer.bridge import skip_no_op_hooks
from tuneup.trainer.optim import set_lr_from_schedule
from tuneup.trainer.state import rng
from tuneup.trainer.state.changes import adopt_optimizer_settings, optimizer_layout_problem
from tuneup.trainer.state.data_order import data_order, restore_data_order
from tuneup.trainer.state.divergence import Diverged, LossWatch, nonfinite_tensors
from tuneup.trainer.state.progress import (
    continue_epoch,
    settle_epoch_boundary,
    start_epoch_afresh,
)
from tuneup.trainer.state.resume import ORDER_KEY, RNG_KEY, RUN_KEY, run_facts


def defer_loss_check(loss, trainer) -> bool:
    """Whether the NaN/inf loss check waits for the logging interval (see LossWatch).

    On one CPU process reading the loss costs nothing, so a bad step stops at once; on CUDA
    it would drain the device queue every step, and across processes the ranks must agree.
    """
    return loss.device.type == "cuda" or trainer.world_size > 1


class RunState(pl.Callback):
    def __init__(self, cfg, watches_outputs: bool = True, owns_optimizer: bool = False) -> None:
        """``watches_outputs``: take the loss from each batch's outputs (a user's
        LightningModule); tuneup's TrainingModule calls :meth:`observe` itself, before backward.
        ``owns_optimizer``: tuneup built the optimizer from the config (its TrainingModule, not
        a user's LightningModule), so a resumed run adopts the config's optimizer settings and
        schedule."""
        self.cfg = cfg
        self.watches_outputs = watches_outputs
        self.owns_optimizer = owns_optimizer
        skip_no_op_hooks(self, pl.Callback)  # of the per-step hooks, it has on_train_batch_end
        self.loss_watch = LossWatch()
        self.validated_at_step: int | None = None
        self._resumed_rng: dict | None = None
        self._resumed_order: dict | None = None
        self._resumed: dict | None = None  # the checkpoint being restored, until training starts
        self._between_epochs = False  # it was written at an epoch's end
        self.restored = False  # a checkpoint's state was restored, and training went on from it
        #: (optimizer step, epoch, micro-batches of it done) where a run resumed mid-epoch in
        #: another layout started (progress.py continue_epoch); None otherwise
        self.started_at: tuple[int, int, int] | None = None
        #: called once training starts from the restored state, every check passed (the
        #: runner's: the run is accepted, trainer/state/run_dir.py ``Claim.accept``)
        self.on_start = None

    def observe(self, loss, trainer, batch_idx: int, batch=None) -> None:
        """Note one micro-batch's loss (raises :class:`Diverged` at once when not deferred);
        ``batch``: the micro-batch, looked at for NaN/inf data when the loss is not finite."""
        step, epoch = trainer.global_step + 1, trainer.current_epoch
        deferred = defer_loss_check(loss, trainer)
        self.loss_watch.observe(
            loss, step, epoch, batch_idx, trainer.global_rank, deferred, data=batch
        )

    def check_loss(self, trainer) -> None:
        strategy = trainer.strategy
        self.loss_watch.check(lambda bad: strategy.reduce_boolean_decision(bad, all=False))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.watches_outputs:
            loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
            if loss is not None:
                self.observe(loss, trainer, batch_idx, batch)
        if (batch_idx + 1) % trainer.log_every_n_steps == 0:
            self.check_loss(trainer)  # CUDA: one sync per logging interval, as logging itself

    def on_train_end(self, trainer, pl_module):
        self.check_loss(trainer)  # the last steps' losses, also when no checkpoint follows

    def on_validation_end(self, trainer, pl_module):
        if not trainer.sanity_checking:
            self.validated_at_step = trainer.global_step

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        self.check_loss(trainer)
        bad = nonfinite_tensors(checkpoint["state_dict"], trainer.strategy.root_device)
        if bad:
            raise Diverged(
                f"not saving step {trainer.global_step}: weights {', '.join(bad[:5])} hold "
                "NaN or inf; the checkpoints written before are kept"
            )
        checkpoint[RNG_KEY] = rng.capture_all_ranks()
        checkpoint[ORDER_KEY] = data_order(trainer)
        checkpoint[RUN_KEY] = run_facts(self.cfg, trainer, checkpoint[ORDER_KEY])

    def on_load_checkpoint(self, trainer, pl_module, checkpoint):
        # Before Lightning restores its loops and optimizers from the same dict.
        self._resumed_rng = rng.for_rank(checkpoint.get(RNG_KEY), trainer.global_rank)
        self._resumed_order = checkpoint.get(ORDER_KEY)
        self._between_epochs = settle_epoch_boundary(checkpoint)
        self._resumed = checkpoint

    def on_fit_start(self, trainer, pl_module):
        # The optimizers exist now, fresh from the config; the checkpoint's are restored next.
        if self._resumed is None:
            return
        saved = self._resumed.get(RUN_KEY)
        names = saved.get("optimizers") if isinstance(saved, dict) else None
        problem = optimizer_layout_problem(self._resumed, trainer, names)
        if problem:
            raise TuneupError(
                f"cannot resume: the checkpoint's optimizer state does not fit this run's "
                f"optimizer ({problem}); resume with the optimizer settings it was written with, "
                "or start a new run from its weights only: resume=<path> "
                "resume_weights_only=true hydra.run.dir=<a new directory>"
            )
        if self.owns_optimizer:
            adopt_optimizer_settings(self._resumed, trainer)

    def on_train_start(self, trainer, pl_module):
        # The training DataLoader exists only now (data_order.py); iteration is lazy.
        left = restore_data_order(trainer, self._resumed_order)
        if left is not None:  # the epoch goes on in another layout: count it in this one's
            self.started_at = continue_epoch(trainer, left)
        if self._resumed_rng is not None:
            rng.restore(self._resumed_rng)
        if self._between_epochs:
            start_epoch_afresh(trainer)
        if self._resumed is not None and self.owns_optimizer:
            for config in trainer.lr_scheduler_configs:  # the new schedule, at the resumed step
                set_lr_from_schedule(config.scheduler)
        self.restored = self._resumed is not None
        self._resumed_rng = self._resumed_order = self._resumed = None
        self._between_epochs = False
        if self.on_start is not None:
            self.on_start()
