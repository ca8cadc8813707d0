"""The time-to-target study's start (time_to_target.py): your command's config, the workers,
the study, its baseline and its space. Apart from the study's run, so that the stages before
it (pipeline.py) know the study's need first, and the study moves onto their recipe after."""

from __future__ import annotations

from tuneup.autotune.race import required_target
from tuneup.autotune.space import own_loop
from tuneup.autotune.study import workers as study_workers
from tuneup.autotune.study.space import build_space, default_params


class StudyStart:
    """Mixed into StudySearch: reads ``settings``, ``lab``, ``checks``, ``budget``, ``sweeps``,
    ``is_group`` and ``continued``; calls ``open_study`` and ``baseline_run``."""

    def prepare(self) -> None:
        """Your command's config, the workers, the study and its baseline: what tells a run's
        time, so that the stages before the study know the study's need (pipeline.py)."""
        self.user_config = config = required_target(self.checks)
        self.use_workers(study_workers.resolve(self.settings.workers, self.lab.launcher, config))
        self.open_study()
        self.warm_workers(config)
        self.baseline_run(config)
        self.build_space()

    def build_space(self) -> None:
        """The study's space (study/space.py; its checks compose every option: seconds on a
        busy machine, which :attr:`space_seconds` keeps for the budget's sharing)."""
        started, config, params = self.budget.elapsed, self.user_config, self.settings.params
        if params is None:
            params = default_params(config, self._warmup_range(), own_loop(config))
        self.space = build_space(params, self.sweeps, self.checks, self.is_group)
        self.space_seconds = self.budget.elapsed - started

    def after_speed(self, lab, checks, recipe: tuple[str, ...]) -> None:
        """The study after a speed stage, in ``lab`` (numbered after its trials) on your
        command plus its ``recipe`` (``checks``): with a recipe, the baseline, the reference
        of every comparison, runs again on it (a continued study keeps its stored one);
        without one, the baseline that ran is the study's."""
        if not recipe:
            lab.trials[:0], lab.alone = self.lab.trials, self.lab.alone
            self.lab = lab
            self.warm_workers(self.user_config)
            return
        self.lab, self.checks = lab, checks
        self.user_config = config = required_target(checks)
        self.use_workers(study_workers.resolve(self.settings.workers, lab.launcher, config))
        self.warm_workers(config)
        if not self.continued:
            self.baseline_run(config, again=True)
        self.space = None  # built again on the recipe's config (run)

    def warm_workers(self, config) -> None:
        """With workers at once in a joblib launcher's processes, each process imports what a
        trial imports before the baseline, the study's first job, which then starts in one
        that has (tuneup/optuna/warm.py); one worker, or another launcher: nothing. Again
        after a speed stage: its trials, one at a time, can leave a process idle for longer
        than joblib keeps one (loky's ``idle_worker_timeout``, 300 s); a process that is
        still warm has nothing to import."""
        from tuneup.optuna.warm import warm

        if self.workers.count > 1:
            warm(self.lab.launcher, config)

    def use_workers(self, workers: study_workers.Workers) -> None:
        """Run with ``workers``; the runs that have the machine to themselves get all of it."""
        self.workers = workers
        self.lab.alone = workers.alone()

    def _warmup_range(self) -> int | None:
        steps = self.baseline.get("steps_to_target")
        return max(2, steps // 2) if steps else None
