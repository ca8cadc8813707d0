"""A run as a trial of tuneup's Optuna sweeper: report the validation metric, stop when pruned.

``hparams_search=optuna`` switches it on (the ``optuna_trial`` node). It acts only in a job the
Optuna sweeper launched (tuneup/optuna/sweeper.py), which tells the job its trial through
Hydra's config: ``hydra.sweeper.trial``, ``storage``, ``study_name``, ``objectives`` and
``pruner``. Anywhere else (a single run, another sweeper) it does nothing, so the command a
sweep report prints to reproduce a trial trains the same run without reporting.

At every validation the first process opens the trial in the study's storage (a journal
file or a database, reachable from joblib's workers and Slurm's nodes alike), reports the
objective's value at the optimizer step (``trial.report``) and asks the study's pruner
(``trial.should_prune``). Pruned: all processes stop at the end of the step
(``trainer.should_stop``, as Lightning's EarlyStopping does); the run ends cleanly, its
summary.json says ``status: pruned`` and the step. Only an objective the validation
measures (``val.acc``, ``val.loss``...) of a study with one objective can be reported
(Optuna prunes single-objective studies only).

The autotune's time-to-target search (tuneup/autotune/time_to_target.py) launches its trials
the same way, with ``hydra.sweeper.objectives=[target]`` and ``hydra.sweeper.step=samples``:
such a trial reports its distance to the target (``target.value - metric`` for a metric that
rises, ``metric - target.value`` for one that falls: lower is better, as the study's samples
to target) at the pruner's rungs, in samples (``min_resource x reduction_factor**k``), so that
successive halving compares trials at equal samples, not at equal steps of different batch
sizes. Optuna's pruner judges a trial at its first report at or past a rung, with that
report's value: reported at each validation, a trial validating every 1,280 samples would be
judged at 2,560 and one validating every 160 at 1,440, for a rung at 1,386. So the trial
reports at the rung itself the distance at the rung's samples, interpolated linearly between
the validations before and after it (the first validation's own when it comes after the
rung), once the validation after it has run (:func:`values_at_rungs`).

Console and summary count both ways: ``optuna: trial 3 (job #4) pruned after 45 optimizer
steps (720 samples)``; the Optuna trial's number and the sweep's job (its directory) differ
in the autotune, whose baseline and confirmation runs are jobs but not study trials.
"""

from __future__ import annotations

import logging
import math

from tuneup import hookimpl

log = logging.getLogger(__name__)

SWEEPER = "hydra_plugins.tuneup_optuna.optuna_sweeper.OptunaSweeper"
AUTOTUNE = "hydra_plugins.tuneup_autotune.autotune_sweeper.AutotuneSweeper"
#: ``hydra.sweeper.objectives=[target]``: the distance to ``target.value`` (autotune).
TARGET = "target"


def trial_settings() -> dict | None:
    """The sweeper's settings of this job's trial, or None when the run is no such trial."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    if not HydraConfig.initialized():
        return None
    sweeper = HydraConfig.get().sweeper
    if sweeper.get("_target_") not in (SWEEPER, AUTOTUNE) or sweeper.get("trial") is None:
        return None
    return OmegaConf.to_container(sweeper, resolve=True)


def reported_metric(settings: dict) -> str | None:
    """The validation metric a trial reports (``acc`` for ``val.acc``), or None: none can be."""
    objectives = settings.get("objectives") or ["val.acc"]
    if list(objectives) == [TARGET]:
        return TARGET
    if len(objectives) != 1 or not str(objectives[0]).startswith("val."):
        return None
    return str(objectives[0]).removeprefix("val.")


def open_trial(settings: dict):
    """The running trial in the study's storage, with the study's pruner."""
    from tuneup.optuna.study import load_trial, make_pruner

    pruner = make_pruner(settings["pruner"])
    return load_trial(settings["storage"], settings["study_name"], settings["trial"], pruner)


def rung_schedule(spec) -> tuple[float, float] | None:
    """(first rung, reduction factor) of a pruner node that has rungs (successive halving,
    Hyperband: ``min_resource x reduction_factor**k``, Hyperband's brackets starting at later
    ones); None for a pruner without them (a name, ``none``, the median pruner)."""
    if not isinstance(spec, dict) or spec.get("min_resource") in (None, "auto"):
        return None
    factor = float(spec.get("reduction_factor", 3))
    start = float(spec.get("min_early_stopping_rate", 0))
    return float(spec["min_resource"]) * factor**start, factor


def values_at_rungs(
    history: list[tuple[int, float]], first: float, factor: float, done: int
) -> list[tuple[int, float]]:
    """(rung, value there) for each rung past the ``done`` already reported that the
    validations in ``history`` ((samples, value), in order) have reached: the value at the
    rung's samples, linear between the validations before and after it; the first
    validation's value where none came before. A rung is ``ceil(first x factor**k)``: at or
    past Optuna's promotion step, so the pruner judges it there."""
    found = []
    while history:
        rung = math.ceil(first * factor ** (done + len(found)) - 1e-9)
        after = next((i for i, (samples, _) in enumerate(history) if samples >= rung), None)
        if after is None:
            break
        samples, value = history[after]
        if after > 0 and samples > rung:
            low, before = history[after - 1]
            value = before + (value - before) * (rung - low) / (samples - low)
        found.append((rung, value))
    return found


def pruned_line(trial: int, job, steps: int, samples: int | None, rung=None) -> str:
    """The console's line for a pruned run: the Optuna trial and the sweep's job, optimizer
    steps and samples, each named."""
    text = f"optuna: trial {trial} (job #{job}) pruned after {steps:,} optimizer steps"
    if samples is not None:
        text += f" ({samples:,} samples)"
    if rung is not None:
        text += f", behind at the rung of {rung:,} samples"
    return text


def job_number():
    """The sweep's job number of this run (its directory), or None outside a sweep."""
    from hydra.core.hydra_config import HydraConfig

    return HydraConfig.get().job.get("num") if HydraConfig.initialized() else None


def report_and_ask(trial, value: float, step: int) -> bool:
    """Report ``value`` at ``step``; whether the pruner stops the trial there."""
    trial.report(value, step)
    return trial.should_prune()


def target_gap(cfg, metrics: dict) -> float | None:
    """How far the validation's target metric is from ``target.value``; lower is better."""
    from tuneup.plugins.target import direction

    node = cfg.get("target") or {}
    metric, goal = node.get("metric"), node.get("value")
    value = metrics.get(metric) if metric else None
    if value is None or goal is None:
        return None
    mode = direction(metric, node.get("mode", "auto")) or "max"
    return float(goal) - float(value) if mode == "max" else float(value) - float(goal)


class Plugin:
    def __init__(self, cfg=None) -> None:
        self.cfg = cfg
        self.settings = trial_settings()
        self.metric = reported_metric(self.settings) if self.settings else None
        self.by_samples = bool(self.settings) and self.settings.get("step") == "samples"
        self.rungs = rung_schedule(self.settings.get("pruner")) if self.by_samples else None
        self.samples = 0  # seen by all processes
        self.history: list[tuple[int, float]] = []  # (samples, value) at each validation
        self.reported = 0  # rungs reported so far
        self.trial = None
        #: where the pruner stopped the run: {"step" (optimizer steps), "samples", "value",
        #: and "rung" (the samples it was judged at) for a pruner with rungs}
        self.pruned: dict | None = None

    @hookimpl
    def on_fit_start(self, trainer):
        if self.metric is not None and trainer.is_global_zero:
            self.trial = open_trial(self.settings)

    @hookimpl
    def on_train_batch_end(self, trainer, batch):
        if self.settings is not None:
            from tuneup.trainer.batches import samples_in

            self.samples += samples_in(batch, trainer.world_size)

    @hookimpl
    def on_validation_end(self, trainer):
        from pytorch_lightning.trainer.states import TrainerFn

        from tuneup.plugins.measure.figures import validation_metrics

        if self.metric is None or trainer.sanity_checking:
            return
        fitting = trainer.state.fn == TrainerFn.FITTING
        stop, value, rung = False, None, None
        if self.trial is not None:
            if self.metric == TARGET:
                value = target_gap(self.cfg, trainer.callback_metrics)
            else:
                value = validation_metrics(trainer.callback_metrics).get(self.metric)
            if value is not None:
                stop, value, rung = self._ask(value, trainer.global_step)
                stop = stop and fitting
        if trainer.world_size > 1:
            stop = trainer.strategy.broadcast(stop, src=0)  # every process stops, or none
        if stop:
            trainer.should_stop = True
            self.pruned = {"step": trainer.global_step, "samples": self.samples, "value": value}
            if rung is not None:
                self.pruned["rung"] = rung
            log.info(
                pruned_line(
                    self.settings["trial"], job_number(), trainer.global_step, self.samples, rung
                )
            )

    def _ask(self, value: float, step: int) -> tuple[bool, float, int | None]:
        """Report ``value`` and ask the pruner: at the optimizer step, at the samples seen
        (``hydra.sweeper.step=samples``), or at each rung passed, the value there
        (:func:`values_at_rungs`). Returns (stop, the value judged, the rung or None)."""
        if not self.by_samples:
            return report_and_ask(self.trial, value, step), value, None
        if self.rungs is None:
            return report_and_ask(self.trial, value, self.samples), value, None
        self.history.append((self.samples, value))
        for rung, at_rung in values_at_rungs(self.history, *self.rungs, self.reported):
            self.reported += 1
            if report_and_ask(self.trial, at_rung, rung):
                return True, at_rung, rung
        return False, value, None

    @hookimpl
    def check(self, cfg, plan):
        """A ``val.*`` objective this trial's run never logs (a swept model may change the
        task): refused before it trains (the sweeper checked the sweep's config already)."""
        from tuneup.optuna.objectives import objective_problems

        if self.settings is None:
            return []
        return objective_problems(self.settings.get("objectives") or ["val.acc"], cfg, plan)

    @hookimpl(trylast=True)  # after the plugins that add the summary's figures
    def report(self, summary):
        if self.pruned is not None and summary.get("status") == "ok":
            summary["status"] = "pruned"  # stopped by the pruner, not by an error
            summary["pruned"] = self.pruned
        if self.settings is not None and summary.get("status") == "ok" and self.metric != TARGET:
            # an autotune trial's figure is its samples to target, read by the autotune itself
            failed_trial(summary, self.settings.get("objectives") or ["val.acc"])

    def describe(self):
        if self.settings is None:
            return {"trial": None, "effect": "none: not a trial of the Optuna sweeper"}
        described = {
            "trial": self.settings["trial"],
            "study": self.settings["study_name"],
            "storage": self.settings["storage"],
        }
        described["reports"] = (
            "the distance to target.value"
            if self.metric == TARGET
            else f"val/{self.metric}"
            if self.metric
            else "nothing (see docs/sweeps.md)"
        )
        described["step"] = (
            "the pruner's rungs, in samples"
            if self.rungs
            else "samples seen"
            if self.by_samples
            else "optimizer steps"
        )
        return described


def failed_trial(summary: dict, objectives: list[str]) -> None:
    """A run without a number for an objective is a failed trial (the sweeper tells Optuna
    so): its summary says it, so that the sweep report counts it and the sweep exits 1."""
    from tuneup.optuna.objectives import missing, numbers

    absent = missing(summary, objectives)
    if absent:
        summary["status"] = "failed"
        summary["error"] = (
            f"hydra.sweeper.objectives: {', '.join(absent)} not a number in this run's "
            f"summary.json, so the trial failed; its numbers: {', '.join(numbers(summary))}"
        )
