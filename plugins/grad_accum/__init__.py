"""Gradient accumulation: k micro-batches per optimizer step, set by ``grad_accum.steps=k``
or derived from ``grad_accum.global_batch_size=N`` as k = N / (data.batch_size x world size).

Lightning does the work (``Trainer(accumulate_grad_batches=k)``): it divides
each micro-batch's loss by k, steps the optimizer and the ``interval: "step"``
LR schedule once per k micro-batches, counts ``max_steps`` in optimizer steps,
and under DDP skips the gradient all-reduce on the k-1 non-final micro-batches
(``no_sync``). This plugin only decides k, refuses a second, different
``trainer.accumulate_grad_batches``, and reports the effective batch size,
data.batch_size x k x world size. Samples/s (plugins/measure/) counts samples.

:func:`effective_batch_size` is the one definition of the samples per optimizer step,
however the user sets it (``grad_accum.steps``, ``grad_accum.global_batch_size``, the
world size): the Trainer's k, the summary, ``describe`` and the linear learning-rate
scaling of ``optimizer=lamb|lars`` (plugins/large_batch.py) all read it, so none of them
can count accumulation its own way.

``grad_accum.micro_batch_size=N|auto`` splits each DataLoader batch into micro-batches of N
inside the training step (micro_batch.py): the same mathematics, less activation
memory; ``auto`` finds N by halving on out-of-memory errors, and the checkpoint keeps it.

Exact only for models without batch-dependent layers: BatchNorm normalises over
each micro-batch, so k micro-batches of b are not one batch of k*b (use
``model=mlp`` to see the equality). If an epoch's batch count is not a multiple
of k, Lightning makes the epoch's last optimizer step from the remaining
micro-batches (each loss still divided by k).
"""

from __future__ import annotations

from tuneup import TuneupError, hookimpl
from tuneup.plugins.grad_accum.micro_batch import MicroBatcher
from tuneup.trainer.environment import Environment
from tuneup.trainer.validation import Integer, problem, problems

RULES = {
    "grad_accum.steps": Integer(low=1, also=(None,), note="null: 1, or from global_batch_size"),
    "grad_accum.global_batch_size": Integer(low=1, also=(None,)),
}


def micro_batch_problems(value, batch_size: int | None) -> list[str]:
    """``grad_accum.micro_batch_size``: null, ``auto``, or a divisor of the batch per process."""
    if value is None or value == "auto":
        return []
    divisors = [d for d in range(1, (batch_size or 0) + 1) if batch_size % d == 0]
    positive = isinstance(value, int) and not isinstance(value, bool) and value >= 1
    if positive and (batch_size is None or value in divisors):
        return []
    allowed = "null (the whole batch at once), 'auto' (halved on out-of-memory errors)"
    if batch_size is None:
        allowed += " or an integer >= 1"
    else:
        shown = ", ".join(map(str, divisors[:12])) + (", ..." if len(divisors) > 12 else "")
        allowed += f" or a divisor of data.batch_size={batch_size} ({shown})"
    return [problem("grad_accum.micro_batch_size", value, allowed)]


def accumulation_steps(steps, global_batch_size, batch_size: int, world_size: int) -> int:
    """k, the micro-batches per optimizer step; raises TuneupError when the settings disagree."""
    if global_batch_size is None:
        return 1 if steps is None else steps
    per_step = batch_size * world_size
    if global_batch_size % per_step:
        lower = max(per_step, global_batch_size // per_step * per_step)
        raise TuneupError(
            f"grad_accum.global_batch_size={global_batch_size} is not allowed: expected a "
            f"multiple of data.batch_size x data-parallel processes = {batch_size} x "
            f"{world_size} = "
            f"{per_step} (e.g. {lower} or {lower + per_step}), so that every optimizer step "
            "sees the same number of micro-batches"
        )
    derived = global_batch_size // per_step
    if steps is not None and steps != derived:
        raise TuneupError(
            f"grad_accum.steps={steps} and grad_accum.global_batch_size={global_batch_size} "
            f"disagree (that global batch needs {derived} steps at data.batch_size={batch_size} "
            f"x {world_size} data-parallel processes); set only one of them"
        )
    return derived


def data_parallel_size(cfg, world_size: int) -> int:
    """The processes that see different samples: under ``strategy=fsdp`` the
    ``strategy.tensor_parallel_size`` processes of a tensor-parallel group share one batch."""
    strategy = cfg.get("strategy") or {}
    return max(1, world_size // (strategy.get("tensor_parallel_size") or 1))


def effective_batch_size(cfg, world_size: int, batch_size: int | None = None) -> int | None:
    """Samples per optimizer step over all processes: the batch per process x k x world size,
    with k from ``grad_accum`` (:func:`accumulation_steps`). The batch per process is
    ``batch_size`` when given (a user's data module's own, once it is known), else
    ``data.batch_size``; None when neither is known. Raises TuneupError as
    accumulation_steps does. The one definition: the Trainer's k, the summary, ``describe``
    and the large-batch learning-rate scaling all read it."""
    batch = batch_size or cfg.data.get("batch_size")
    if batch is None:
        return None
    world_size = data_parallel_size(cfg, world_size)  # a tensor-parallel group: one batch
    node = cfg.get("grad_accum") or {}
    k = accumulation_steps(node.get("steps"), node.get("global_batch_size"), batch, world_size)
    return batch * k * world_size


class Plugin:
    def __init__(self, cfg) -> None:
        self.cfg = cfg
        self.world_size: int | None = None  # from check's Environment; what the run will use
        self.batch: int | None = cfg.data.get("batch_size")  # per process; a data module's own
        self.k: int | None = None  # as given to the Trainer
        size = cfg.grad_accum.get("micro_batch_size")
        self.micro = MicroBatcher(None if size == "auto" else size, auto=size == "auto")

    def processes(self) -> int:
        return self.world_size or Environment.from_config(self.cfg).world_size

    def world(self) -> int:
        """The data-parallel processes (a tensor-parallel group shares its batch)."""
        return data_parallel_size(self.cfg, self.processes())

    def steps(self) -> int:
        steps, total = (self.cfg.grad_accum.get(k) for k in ("steps", "global_batch_size"))
        if total is not None and self.batch is None:
            raise TuneupError(
                f"grad_accum.global_batch_size={total} needs the batch per process, but "
                "data.batch_size is null and the data module's own is not known: set "
                "data.batch_size, or grad_accum.steps instead"
            )
        return accumulation_steps(steps, total, self.batch, self.world())

    @hookimpl
    def check(self, cfg, env, plan):
        self.world_size = env.world_size
        if self.batch is None and plan is not None and plan.sound:
            self.batch = plan.data.batch_size  # the user's data module's, now it is set up
        found = problems(cfg, RULES)
        found += micro_batch_problems(cfg.grad_accum.get("micro_batch_size"), self.batch)
        if found:
            return found
        try:
            k = self.steps()
        except TuneupError as exc:
            return [str(exc)]
        lightning = cfg.trainer.get("accumulate_grad_batches")
        if lightning is not None and lightning != k:
            found.append(
                f"trainer.accumulate_grad_batches={lightning} conflicts with grad_accum "
                f"(k={k} micro-batches per optimizer step): set accumulation in one place, "
                f"grad_accum.steps={lightning}, and remove trainer.accumulate_grad_batches"
            )
        return found

    @hookimpl
    def configure_trainer(self, kwargs):
        self.k = kwargs["accumulate_grad_batches"] = self.steps()

    @hookimpl
    def on_fit_start(self, trainer, module):
        if self.micro.auto or self.micro.size is not None:
            self.micro.install(trainer, module)

    @hookimpl
    def report(self, cfg, summary):
        world = summary.get("world_size") or self.processes()
        summary["effective_batch_size"] = effective_batch_size(cfg, world, self.batch)
        if self.micro.auto or self.micro.size is not None:
            summary["micro_batch_size"] = self.micro.size or self.batch
            summary["micro_batch_oom_retries"] = self.micro.retries

    def state_dict(self):
        return {"micro_batch_size": self.micro.size, "oom_retries": self.micro.retries}

    def load_state_dict(self, state):
        """auto: the size the checkpointed run found (a resume does not search again)."""
        if self.micro.auto and state.get("micro_batch_size") is not None:
            self.micro.size, self.micro.retries = state["micro_batch_size"], state["oom_retries"]

    def describe(self):
        settings = {k: self.cfg.grad_accum.get(k) for k in ("steps", "global_batch_size")}
        if self.micro.auto:
            settings["micro_batch_size"] = f"auto (found: {self.micro.size or self.batch})"
        elif self.micro.size is not None:
            settings["micro_batch_size"] = self.micro.size
        try:
            k = self.steps()
            effective = effective_batch_size(self.cfg, self.processes(), self.batch)
        except TuneupError:
            return settings  # check reports the problem
        return {**settings, "steps": k, "effective_batch_size": effective}
