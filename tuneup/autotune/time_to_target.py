"""``autotune.objective=time_to_target``: an Optuna study over what decides races, then
paired seeds, then paired throughput windows.

::

    baseline    the user's command trained to its target (target.stop=true) on the search
                seed, within the user's own limits: its samples to target S set each trial's
                budget (S x autotune.race_margin samples; not reached: the samples it ran),
                a sample limit the scheduler does not see (race.sample_limit): every run
                keeps the user's trainer.max_steps / max_epochs, the schedule of the recipe
    explore     an Optuna study (ask and tell; storage and continuation as hparams_search=optuna:
                tuneup/optuna/study.py) over autotune.params (study/space.py), TPE seeded
                (multivariate, grouped for the conditional keys); each trial trains to the
                target on the search seed and reports its distance to the target at every
                validation against the samples seen (plugins/optuna_trial.py); successive
                halving (or Hyperband) prunes the trials that are behind at equal samples.
                The value: its cost to the target (autotune.cost: time = steps x its own
                seconds per step + validations, steps, or samples; study/trials.py: trial_cost);
                a miss: its cost so far x (1 + its last relative distance), raised to the
                costliest hit's so far x the same (study/explore.py: above_the_hits).
                Up to autotune.workers trials at once (study/explore.py, study/workers.py)
    confirm     the best autotune.confirm distinct configurations (confirm/distinct.py) and
                the baseline, each on the same autotune.seeds seeds the study never saw
                (seed+1, seed+2, ...), seeds added while undecided; a candidate
                wins only when its per-seed differences in cost from the baseline's have a t
                interval below 0 (paired.py); the lowest mean cost among winners is the pick
    speed       the pick and the baseline's seconds per step, from short interleaved
                throughput trials (confirm/speed.py); estimated time to target = steps x
                s/step + the validations' seconds, its ratio's interval on the log scale
                (time_ratio.py); with autotune.cost=time a pick not faster in it beyond the
                noise is not adopted

The budget: ``autotune.budget_trials`` study trials (the baseline aside), or
``autotune.budget_samples`` samples trained by them, whichever comes first; and
``autotune.budget_minutes`` over everything, shared by study/budget.py once the baseline's time
is known: a budget too small for one study trial and one confirmation is refused there; the
confirmation gets room for as many candidates as fit in half of what is left (at least one),
with the leading one's seeds added up to autotune.max_seeds, the held-out run and the speed
stage, and the study runs until the minutes left are that room; what the answer leaves goes
back to the study while it has trials (study/explore.py: go_on). A trial gets
``trainer.max_time`` of what is left above it, and no trial starts that could not finish in it.
"""

from __future__ import annotations

import logging
import math
import warnings

from tuneup import TuneupError
from tuneup.autotune.confirm.advice import baseline_stop
from tuneup.autotune.race import race_settings, reached, sample_limit
from tuneup.autotune.study import BudgetShare, handover
from tuneup.autotune.study import leader as study_leader
from tuneup.autotune.study import workers as study_workers
from tuneup.autotune.study.sampler import study_sampler
from tuneup.autotune.study.start import StudyStart
from tuneup.autotune.study.trials import (
    BASELINE_ATTR,
    JOB_ATTR,
    OVERRIDES_ATTR,
    config_value,
    console_line,
    figures,
    samples_seen,
    trial_value,
)
from tuneup.autotune.trials import BASELINE, Trial
from tuneup.optuna.liveness import Heartbeat

log = logging.getLogger(__name__)


class StudySearch(StudyStart, BudgetShare):
    def __init__(
        self,
        settings,
        lab,
        checks,
        budget,
        seed: int,
        storage: str,
        sweeps=(),
        is_group=lambda key: False,
    ) -> None:
        self.settings, self.lab, self.checks, self.budget = settings, lab, checks, budget
        self.seed, self.storage, self.sweeps, self.is_group = seed, storage, list(sweeps), is_group
        self.confirm_seeds = [seed + 1 + i for i in range(settings.seeds)]
        self.recipe: tuple[str, ...] = ()
        self.baseline: dict = {}  # the baseline's figures on the search seed
        self.user_config = None  # your command's config, once run() composed it
        self.space = None
        self.study = None
        self.confirmed: dict[str, dict] = {}  # label -> {"overrides", "trials", "decision"}
        self.confirm_count = settings.confirm  # candidates the budget confirms (share_budget)
        self.confirm_added = 0  # the leading candidate's seeds added it holds (share_budget)
        self.speed_rounds = settings.min_rounds  # speed rounds kept room for (keep_rounds)
        self.answered = False  # the answer given: the study has what is left (go_on)
        self._released = False  # the confirmation's room given to the study (reserve)
        self.workers = study_workers.Workers(1, False, 1)  # autotune.workers, resolved in run
        self.step_cost: dict[
            tuple[str, ...], float
        ] = {}  # confirm/step_cost.py: s/step timed apart
        self.speed = None  # confirm/speed.py: Speed
        self.verdict = ""  # the answer, in words
        self.sweeper = _sweeper_id()  # host:pid, as the study's trials and tickets name it
        self.ticket: int | None = None  # the number of its first trial (study/leader.py)
        self.answered_by: dict | None = None  # the sweeper that answers, when not this one
        self.notes: list[str] = []
        self.before = (0.0, 0.0)  # the stages before the study: seconds, budget share
        self.continued = False  # the baseline came from the storage (a continued study)
        self.space_seconds = 0.0  # what building the space took (build_space)

    # -- the stages ---------------------------------------------------------------------------

    def run(self) -> StudySearch:
        if self.study is None:  # else prepare() ran before the stages ahead of the study
            self.prepare()
        config = self.user_config
        if self.space is None:
            self.build_space()
        self.share_budget()
        self.add_baseline_trial(config)
        with Heartbeat(self.study, self.sweeper):  # other hosts see this sweeper live
            try:
                self.explore()
                if not handover.lead(self):  # another sweeper on the study answers
                    return self
                self.confirm()
                self.decide()
            except BaseException:
                study_leader.ended(self.study, self.sweeper)
                raise
            study_leader.answered(self.study, self.sweeper, str(self.lab.sweep_dir))
            self.go_on()
        return self

    def open_study(self) -> None:
        import optuna

        from tuneup.optuna import study as studies
        from tuneup.optuna.resume import mark_interrupted_runs

        opened = studies.open_storage(self.storage, key="autotune.storage")
        warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
        sampler = study_sampler(self.settings, self.seed, self.workers.count)
        self.study = studies.create_study(
            opened, self.settings.study_name, sampler, None, ["minimize"]
        )
        recovered = studies.recover_interrupted(self.study, opened)
        mark_interrupted_runs(self.lab.sweep_dir, self.study, recovered)  # not failed runs
        self._opened = opened

    def baseline_run(self, config, again: bool = False) -> None:
        """Your command to its target on the search seed, stored in the study; ``again``: run
        even though this search stored one already (on a new recipe)."""
        stored = None if again else self.study.user_attrs.get(BASELINE_ATTR)
        if stored:  # a continued study: its baseline ran already
            self.baseline, self.continued = stored, True
            self.notes.append(
                f"continued study '{self.study.study_name}': the baseline and "
                f"{len(self.explored())} finished trial(s) kept"
            )
            return
        limit = self.left()
        trial = self.race_run(BASELINE, (), self.seed, samples=None, limit_s=limit)
        if not trial.ok:
            raise TuneupError(
                f"the baseline trial (your command as it is) failed: {trial.error}; see "
                f"{trial.directory}; the autotune needs a command that trains"
            )
        seen = samples_seen(trial)
        hit = trial.figure("samples_to_target") if reached(trial) else None
        budget = math.ceil(hit * self.settings.race_margin) if hit else seen
        self.baseline = {
            "job": trial.job,
            "reached": hit is not None,
            "samples_to_target": hit,
            "steps_to_target": trial.figure("steps_to_target"),
            "samples_seen": seen,
            "seconds": trial.seconds,
            "trial_samples": max(1, budget),
            "ranked_by": self.settings.cost,
            "value": trial_value(trial, self.settings.cost),
            **figures(trial, self.settings.cost),
            **baseline_stop(trial.summary, max(1.0, limit), trial.seconds),
        }
        log.info("autotune: your command: %s", console_line(self.baseline, self.settings.cost))
        self.study.set_user_attr(BASELINE_ATTR, self.baseline)

    def add_baseline_trial(self, config) -> None:
        """The user's own values as a finished trial of the study (not run again), so the
        sampler knows where the search started."""
        import optuna

        if any(t.user_attrs.get(BASELINE_ATTR) for t in self.study.get_trials(deepcopy=False)):
            return
        values = self.space.params_of(lambda key: config_value(config, key))
        if values is None or not self.baseline["reached"]:
            return  # the user's value is outside the space: no such trial
        if self.baseline.get("value") is None:
            return
        if self.baseline.get("ranked_by") != self.settings.cost:
            return  # a continued study ranked by another cost: its value would not compare
        trial = optuna.trial.create_trial(
            params=values,
            distributions={k: self.space.distributions[k] for k in values},
            value=float(self.baseline["value"]),
            user_attrs={BASELINE_ATTR: True, JOB_ATTR: self.baseline["job"], OVERRIDES_ATTR: []},
        )
        self.study.add_trial(trial)

    def explore(self) -> None:
        from tuneup.autotune.study.explore import explore

        explore(self)

    def go_on(self) -> None:
        from tuneup.autotune.study.explore import go_on

        go_on(self)

    def explored(self) -> list:
        """The study's finished trials, the baseline's aside (what autotune.budget_trials counts)."""
        from tuneup.optuna import study as studies

        return [t for t in studies.finished(self.study) if not t.user_attrs.get(BASELINE_ATTR)]

    def confirm(self) -> None:
        from tuneup.autotune.confirm import confirm

        confirm(self)

    def decide(self) -> None:
        from tuneup.autotune.confirm import decide

        decide(self)

    # -- trials and the budget -------------------------------------------------------------------

    def race_run(self, name, overrides, seed, samples, limit_s, extra=(), worker=None) -> Trial:
        """``overrides`` trained to the target on ``seed``, for at most ``samples`` samples
        (None: the user's own limits) and ``limit_s`` seconds, with ``worker``'s share of the
        machine (study_workers.Workers.resources; None: all of it). The user's trainer.max_steps / max_epochs
        stay: the schedule is the one the recipe runs (race.sample_limit)."""
        settings = [*race_settings(max(1.0, limit_s)), *sample_limit(samples), *extra]
        return self.lab.run(name, (*overrides, f"seed={seed}"), settings=settings, worker=worker)

    def batch(self, overrides) -> int:
        """Samples per optimizer step of a configuration (data.batch_size x grad_accum.steps)."""
        cfg = self.checks.inspect(tuple(overrides)).config or self.checks.inspect(()).config
        batch = int((cfg.get("data") or {}).get("batch_size") or 1)
        return batch * int((cfg.get("grad_accum") or {}).get("steps") or 1)

    def job_settings(self, trial) -> dict:
        from tuneup.optuna.space import override_value

        return {
            "trial": trial.number,
            "storage": override_value(self.storage),
            "study_name": override_value(self.study.study_name),
            "objectives": "[target]",
            "step": "samples",
            "pruner": self.pruner_spec(),
        }

    def pruner_spec(self) -> str:
        """The pruner as a Hydra override value (the job makes the same one), in samples:
        rungs at S/3 and S (S: the baseline's samples to target, or the samples it ran when it
        did not reach), each trial judged at the rung's samples (plugins/optuna_trial.py).
        The first rung is not lower: there a trial has had one or two validations, and on a
        noisy metric most trials would be pruned on noise (docs/benchmarks.md#race-time-to-target)."""
        hit = self.baseline.get("samples_to_target") or self.baseline.get("samples_seen")
        low = max(1, int((hit or self.baseline["trial_samples"]) // 3))
        if self.settings.pruner == "hyperband":
            return (
                f"{{_target_:optuna.pruners.HyperbandPruner,min_resource:{low},"
                f"max_resource:{self.baseline['trial_samples']},reduction_factor:3}}"
            )
        if self.settings.pruner == "none":
            return "none"
        return (
            f"{{_target_:optuna.pruners.SuccessiveHalvingPruner,min_resource:{low},"
            "reduction_factor:3,min_early_stopping_rate:0}"
        )


def _sweeper_id() -> str:
    from tuneup.optuna.study import sweeper_id

    return sweeper_id()
