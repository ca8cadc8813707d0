"""The Optuna sweeper (``hydra/sweeper=optuna``, set by ``hparams_search=optuna``), on Optuna's
ask-and-tell API: ask a trial, launch it as a job through the user's launcher (basic, joblib,
Slurm), tell it what its run's summary.json says, until the study has ``n_trials`` finished
trials. ``hydra.sweeper.n_jobs`` trials run at once, each asked when a worker is free: no
batch waits for its slowest trial (tuneup/optuna/workers.py).

- Objectives: ``hydra.sweeper.objectives`` names summary.json keys (``val.acc``,
  ``samples_per_s``...), one per ``direction``; two or more: a multi-objective study.
- Pruning: each job is told its trial (``hydra.sweeper.trial``) and the storage; the trial's
  run reports its validation metric at every validation and stops when the pruner says so
  (plugins/optuna_trial.py), writing ``status: pruned``; the sweeper tells Optuna PRUNED.
- Continuing: the study lives in a storage (tuneup/optuna/study.py); the same command with the
  same storage picks up where a killed sweep stopped.
- Settings: the sweeper's node, checked before anything is written (tuneup/optuna/settings.py).
- The report: optuna_report.md (and pareto.png for several objectives) in the sweep
  directory (tuneup/optuna/report.py), besides tuneup's sweep report (report.md).

Hydra instantiates sweepers only from the ``hydra_plugins`` package:
``hydra_plugins/tuneup_optuna`` holds the class Hydra sees, which hands over to this one.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import re
from pathlib import Path

import optuna
from omegaconf import OmegaConf
from optuna.trial import TrialState

from tuneup import TuneupError
from tuneup.errors import user_errors
from tuneup.optuna import study as studies
from tuneup.optuna.liveness import Heartbeat
from tuneup.optuna.objectives import objective, objective_problems
from tuneup.optuna.resume import continued_sampler, mark_interrupted_runs
from tuneup.optuna.settings import Settings
from tuneup.optuna.space import Space, override_value, parse_space
from tuneup.optuna.unread import fit_space, given_lines
from tuneup.optuna.workers import run_trials, worker_count

log = logging.getLogger(__name__)


class OptunaSearch:
    def __init__(self, sampler, pruner, node) -> None:
        self.sampler, self.pruner = sampler, pruner  # made by Hydra from their nodes
        self.node = node  # the sweeper's other settings

    def setup(self, *, hydra_context, task_function, config) -> None:
        from hydra.core.plugins import Plugins

        self.config, self.hydra_context = config, hydra_context
        with user_errors():
            self.settings = Settings.from_node(self.node)
        self.launcher = Plugins.instance().instantiate_launcher(
            config=config, hydra_context=hydra_context, task_function=task_function
        )

    def sweep(self, arguments: list[str]):
        with user_errors():
            return self._sweep(arguments)

    def _sweep(self, arguments: list[str]):
        from tuneup.optuna.report import write_report

        settings = self.settings
        space = parse_space(self.node.get("params"), arguments)  # a bad setting: nothing written
        first = self.first_trial(space)
        if first is not None:  # keys nothing reads: refused, or left out of tuneup's default
            space = fit_space(space, given_lines(self.node.get("params"), arguments), *first)
        self.check_objectives(first)
        sampler, n_trials = self.complete_sampler(space)
        pruner = self.study_pruner()
        sweep_dir = Path(self.config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        storage = studies.resolve_storage(settings.storage, sweep_dir)
        opened = studies.open_storage(storage)
        with studies.storage_errors(storage):  # an existing read-only file fails on writing
            study = studies.create_study(
                opened, settings.study_name, sampler, pruner, settings.directions
            )
            stored = len(study.get_trials(deepcopy=False))
            recovered = studies.recover_interrupted(study, opened)
        if stored:  # a continued study: not the first process's draws again (resume.py)
            node = self.config.hydra.sweeper.get("sampler")
            study.sampler, _ = self.complete_sampler(
                space, continued_sampler(node, sampler, stored)
            )
            sampler = study.sampler
        mark_interrupted_runs(sweep_dir, study, recovered)
        log.info(
            "optuna: study '%s' in %s, %s, %s; %d of %d trials finished",
            study.study_name,
            storage,
            type(sampler).__name__,
            type(pruner).__name__,
            len(studies.finished(study)),
            n_trials,
        )
        job = [
            f"hydra.sweeper.storage={override_value(storage)}",
            f"hydra.sweeper.study_name={override_value(study.study_name)}",
        ]
        with Heartbeat(study, studies.sweeper_id()):  # liveness.py: other hosts see it live
            run_trials(
                study,
                workers=worker_count(self.launcher, settings.n_jobs),
                n_trials=n_trials,
                ask=lambda: self.ask_job(study, opened, space, job),
                launch=self.launch,
                tell=lambda trial, run_dir: self.tell(study, trial, run_dir),
                max_failure_rate=settings.max_failure_rate,
            )
        return write_report(study, sweep_dir, settings.objectives, storage)

    def ask_job(self, study, opened, space: Space, job: list[str]) -> tuple[object, list[str]]:
        """A new trial, marked as this process's, and its job's overrides; the trials of
        another sweeper on the study that is gone meanwhile (a host lost) are failed first,
        so that their values come next."""
        studies.recover_interrupted(study, opened, keep=studies.sweeper_id(), quiet=True)
        trial = ask(study, space)
        trial.set_user_attr(studies.SWEEPER_ATTR, studies.sweeper_id())
        return trial, [*space.overrides(trial.params), f"hydra.sweeper.trial={trial.number}", *job]

    def launch(self, number: int, overrides: list[str]) -> Path:
        """Run trial ``number``'s job, a batch of one, and give its run directory. Job number =
        trial number, so a continued study's runs never reuse a directory and jobs launched
        at once never share one (tuneup/optuna/workers.py)."""
        (ret,) = self.launcher.launch([overrides], initial_job_idx=number)
        return Path(ret.hydra_cfg.hydra.runtime.output_dir)

    def tell(self, study, trial, run_dir: Path) -> bool:
        """Tell the study what the run's summary.json says; True if the trial failed."""
        trial.set_user_attr(studies.RUN_DIR_ATTR, str(run_dir))
        summary = read_summary(run_dir)
        status = summary.get("status", "no summary.json")
        if status == "pruned":
            _tell(study, trial, state=TrialState.PRUNED)
            return False
        values = [objective(summary, key) for key in self.settings.objectives]
        if status == "ok" and all(v is not None for v in values):
            _tell(study, trial, values=values)
            return False
        if status == "ok":
            missing = [
                k for k, v in zip(self.settings.objectives, values, strict=True) if v is None
            ]
            log.warning(
                "optuna: trial %d (%s) has no %s in its summary.json: failed",
                trial.number,
                run_dir,
                ", ".join(missing),
            )
        _tell(study, trial, state=TrialState.FAIL)
        return True

    def first_trial(self, space: Space):
        """(config, Plan) of a trial with each parameter at its first value, or None where it
        does not compose or build (the runs report it)."""
        from tuneup.trainer.components import Plan

        overrides = space.overrides({key: _first(d) for key, d in space.distributions.items()})
        for _ in range(len(overrides) + 1):
            try:
                cfg = self.hydra_context.config_loader.load_sweep_config(self.config, overrides)
                return cfg, Plan(cfg)
            except Exception as exc:
                # a key the config lacks (model=mlp model.lr=...): added with Hydra's +, for
                # fit_space to name what nothing would read
                if (added := _plus_refused(overrides, exc)) is None:
                    log.debug("optuna: the space is not checked up front: %s", exc)
                    return None
                overrides = added
        return None

    def check_objectives(self, first) -> None:
        """Refuse, before any trial trains, a ``val.*`` objective the runs never log
        (objectives.py), for ``first``: :meth:`first_trial`."""
        if first is None:
            return
        try:
            found = objective_problems(self.settings.objectives, *first)
        except Exception as exc:  # the runs report a config that does not compose or build
            log.debug("optuna: objectives not checked up front: %s", exc)
            return
        if found:
            raise TuneupError("; ".join(found))

    def complete_sampler(self, space: Space, sampler=None):
        """The sampler the config names (or ``sampler``, made from its node), and the trials to
        run (a grid has so many points)."""
        sampler = self.sampler if sampler is None else sampler
        n_trials = self.settings.n_trials
        if isinstance(sampler, functools.partial):  # the grid: made from the params
            grid = space.grid()
            sampler = sampler(search_space=grid)
            points = math.prod(len(v) for v in grid.values())
            if points < n_trials:
                log.info(
                    "optuna: the grid has %d points: n_trials %d -> %d", points, n_trials, points
                )
                n_trials = points
        return sampler, n_trials

    def study_pruner(self):
        pruner = studies.make_pruner(self.pruner)
        if len(self.settings.directions) > 1:
            if not isinstance(pruner, optuna.pruners.NopPruner):
                log.info("optuna: no pruning: Optuna prunes studies of one objective only")
            return optuna.pruners.NopPruner()
        return pruner


def ask(study, space: Space):
    """The next trial; a space whose kinds the stored study's trials contradict is refused."""
    try:
        return study.ask(space.distributions)
    except ValueError as exc:  # Optuna's storage: a key sampled as another kind before
        raise TuneupError(
            f"the search space does not fit the stored study '{study.study_name}': {exc} "
            "(choice(), range(), interval() and tag(log, ...) are kinds; a choice keeps its "
            "values); keep them, or start another study: hydra.sweeper.study_name=<new name>"
        ) from exc


def _plus_refused(overrides: list[str], exc: Exception) -> list[str] | None:
    """``overrides`` with ``+`` before the one Hydra could not override (a key the config
    lacks), or None where ``exc`` is another error."""
    refused = re.search(r"Could not override '([^']+)'", str(exc))
    keys = [o.split("=", 1)[0] for o in overrides]
    if refused is None or refused.group(1) not in keys:
        return None
    return [
        f"+{o}" if key == refused.group(1) else o for o, key in zip(overrides, keys, strict=True)
    ]


def _first(distribution):
    """A parameter's first value: a choice's first, a range's or an interval's low end."""
    choices = getattr(distribution, "choices", None)
    return choices[0] if choices is not None else distribution.low


def _tell(study, trial, **kwargs) -> None:
    try:
        study.tell(trial, **kwargs)
    except RuntimeError as exc:  # GridSampler stops the study when the grid is done: no loop here
        if "Study.stop" not in str(exc):
            raise


def read_summary(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return {}
