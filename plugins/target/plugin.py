"""The hook layer of ``target.metric=... target.value=...``: cadence, clock, stop, summary."""

from __future__ import annotations

import re

import torch

from tuneup import TuneupError, hookimpl
from tuneup.trainer.batches import samples_in
from tuneup.trainer.validation import BOOL, Integer, Number, OneOf, problem, problems

from .energy import EnergyCounter
from .race import Race

MODES = ("auto", "max", "min")
RULES = {
    "target.value": Number(also=(None,)),
    "target.mode": OneOf(MODES),
    "target.check_every_n_steps": Integer(low=1, also=(None,)),
    "target.stop": BOOL,
    "target.max_samples": Integer(low=1, also=(None,)),
}
#: Words of a metric's name that say which way is better (``target.mode=auto``).
HIGHER = ("acc", "top1", "top5", "f1", "auc", "iou", "map", "precision", "recall", "bleu", "score")
LOWER = ("loss", "perplexity", "ppl", "err", "mse", "mae", "rmse", "wer", "cer", "nll")
#: Words of a metric's name that say it is a fraction, in [0, 1]: a target outside is never met.
FRACTION = ("acc", "top1", "top5", "f1", "auc", "iou", "precision", "recall")


def direction(metric: str, mode: str = "auto") -> str | None:
    """``max`` or ``min``: ``mode`` itself, or for ``auto`` from the words of the metric's name
    (``val/acc`` -> max, ``val/loss`` -> min); None when the name does not tell."""
    if mode != "auto":
        return mode
    words = [w for w in re.split(r"[^a-z0-9]+", metric.lower()) if w]
    up = any(w.startswith(HIGHER) for w in words)
    down = any(w.startswith(LOWER) for w in words)
    return None if up == down else ("max" if up else "min")


def is_fraction(metric: str) -> bool:
    """Whether the metric's name says it is a fraction in [0, 1] (``val/acc``, ``val_f1``)."""
    return any(w.startswith(FRACTION) for w in re.split(r"[^a-z0-9]+", metric.lower()) if w)


def settings_problems(cfg, plan=None) -> list[str]:
    """Bad values of ``target.*``, a metric the task never logs, a cadence set twice."""
    node = cfg.get("target") or {}
    metric = node.get("metric")
    found = problems(cfg, RULES)
    if metric is None:
        if node.get("value") is not None or node.get("stop"):
            found.append(
                f"target.value={node.get('value')!r} target.stop={node.get('stop')!r} "
                "need target.metric (e.g. target.metric=val/acc)"
            )
        return found
    if not isinstance(metric, str) or not metric:
        return [*found, problem("target.metric", metric, "a logged metric name, e.g. 'val/acc'")]
    if not found and direction(metric, node.get("mode", "auto")) is None:
        found.append(
            f"target.mode=auto cannot tell whether higher or lower is better for "
            f"target.metric={metric}; set target.mode=max or target.mode=min"
        )
    value = node.get("value")
    if not found and value is not None and is_fraction(metric) and not 0 <= value <= 1:
        found.append(
            problem(
                "target.value",
                value,
                f"a number in [0, 1]: target.metric={metric} "
                "is a fraction by its name (acc, top1, f1...), e.g. 0.9",
            )
        )
    if node.get("stop") and node.get("value") is None:
        found.append(
            "target.stop=true needs target.value: the run stops when the metric reaches it"
        )
    if plan is not None and plan.sound and not plan.lightning and metric not in plan.task.metrics:
        found.append(
            f"target.metric={metric} is not logged by this run: task={plan.task.name} "
            f"logs {', '.join(plan.task.metrics)} at each validation"
        )
    trainer = cfg.trainer
    if node.get("check_every_n_steps") is not None:
        for key in ("val_check_interval", "check_val_every_n_epoch"):
            if trainer.get(key) is not None:
                found.append(
                    f"target.check_every_n_steps={node.check_every_n_steps} and "
                    f"trainer.{key}={trainer.get(key)} both set the validation cadence; "
                    "set only one"
                )
    if trainer.get("limit_val_batches") in (0, 0.0):
        found.append(
            f"target.metric={metric} needs validation, but trainer.limit_val_batches=0 turns it off"
        )
    return found


def metric_value(trainer, metric: str) -> float:
    """The metric as the validation just logged it (one read, at validation end)."""
    value = trainer.callback_metrics.get(metric)
    if value is None:
        logged = ", ".join(sorted(k for k in trainer.callback_metrics)) or "none"
        raise TuneupError(
            f"target.metric={metric} was not logged by the validation (logged: "
            f"{logged}); set target.metric to one of them"
        )
    return float(value)


class Plugin:
    def __init__(self, cfg) -> None:
        node = cfg.get("target") or {}
        self.metric = node.get("metric")
        self.every = node.get("check_every_n_steps")
        self.stop = bool(node.get("stop"))
        self.race: Race | None = None
        if isinstance(self.metric, str) and self.metric:
            mode = direction(self.metric, node.get("mode", "auto")) or "max"
            self.race = Race(self.metric, node.get("value"), mode)
        self.energy: EnergyCounter | None = None
        self.world_size = 1
        self.device = None
        self.recording = False  # the running validation goes into the record
        self.first_rank = True
        self.limit = node.get("max_samples")  # a stop the schedule does not see
        self.seen = 0  # samples of all processes, for the limit
        self.micro_batches = 0

    @hookimpl
    def check(self, cfg, plan):
        return settings_problems(cfg, plan)

    @hookimpl(trylast=True)  # after grad_accum decided k (accumulate_grad_batches)
    def configure_trainer(self, kwargs):
        if self.race is not None and self.every is not None:
            # Lightning counts the interval in micro-batches; across epochs when it is None
            kwargs["val_check_interval"] = self.every * kwargs.get("accumulate_grad_batches", 1)
            kwargs["check_val_every_n_epoch"] = None

    @hookimpl
    def on_fit_start(self, trainer, module):
        self.world_size, self.device = trainer.world_size, module.device
        self.first_rank = trainer.is_global_zero
        if self.race is None:
            return
        if self.stop and self.race.crossing is not None:
            trainer.should_stop = True  # resumed after the target was reached: nothing to train

    def _start(self) -> None:
        """The session's clock and energy counter start at its first step (or validation)."""
        if self.race.started is None:
            self.race.start()
            if self.first_rank:  # rank 0's GPU x processes: every rank does the same work
                self.energy = EnergyCounter.open(self.device)

    @hookimpl
    def on_train_batch_start(self):
        if self.race is not None:
            self._start()

    @hookimpl
    def on_train_batch_end(self, trainer, batch):
        samples = samples_in(batch, self.world_size)
        if self.race is not None:
            self.race.add_samples(samples)
        if self.limit is not None:
            self._stop_at_limit(trainer, samples)

    def _stop_at_limit(self, trainer, samples: int) -> None:
        """``target.max_samples``: stop at the end of the optimizer step that reaches it, as
        EarlyStopping stops a run (``trainer.should_stop``; Lightning validates there once
        more). The scheduler's horizon stays what ``trainer.max_steps`` / ``max_epochs`` make
        it: the autotune's race budget cuts a trial short without squeezing its schedule."""
        self.seen += samples
        self.micro_batches += 1
        stepped = self.micro_batches % max(1, trainer.accumulate_grad_batches) == 0
        if stepped and self.seen >= self.limit:
            trainer.should_stop = True

    def _records(self, trainer) -> bool:
        """Whether this validation goes into the record: not a sanity check, and not a second
        one at a step already recorded (the final validation of a resumed, finished run)."""
        if self.race is None or trainer.sanity_checking:
            return False
        history = self.race.history
        return not history or history[-1]["step"] != trainer.global_step

    @hookimpl
    def on_validation_start(self, trainer):
        self.recording = self._records(trainer)
        if not self.recording:
            return
        if self.device is not None and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # the queued training steps are training time
        self._start()
        self.race.validation_start()

    @hookimpl
    def on_validation_end(self, trainer):
        if not self.recording:
            return
        value = metric_value(trainer, self.metric)
        crossed = self.race.validation_end(trainer.global_step, value, self._energy_j())
        if self.stop and trainer.world_size > 1:  # every rank stops, or none
            crossed = trainer.strategy.reduce_boolean_decision(crossed, all=False)
        if self.stop and crossed:
            trainer.should_stop = True

    def _energy_j(self) -> float | None:
        if self.energy is None:
            return None
        return self.race.energy_before_j + self.energy.joules()

    @hookimpl
    def report(self, summary):
        if self.race is not None:
            gpu = getattr(self.device, "type", None) == "cuda"
            summary.update(self.race.figures(summary.get("world_size") or self.world_size, gpu=gpu))

    def state_dict(self) -> dict:
        return {} if self.race is None else self.race.state_dict(self._energy_j())

    def load_state_dict(self, state: dict) -> None:
        if self.race is not None and state:
            self.race.load_state_dict(state)

    def describe(self):
        if self.race is None:
            return {"metric": None}
        return {
            "metric": self.metric,
            "value": self.race.value,
            "mode": self.race.mode,
            "check_every_n_steps": self.every,
            "stop": self.stop,
        }
