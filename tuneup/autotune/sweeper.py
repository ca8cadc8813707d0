"""The autotune as a Hydra sweeper: ``tuneup -m experiment=autotune [your overrides]``.

Hydra hands a sweeper the sweep's config and a launcher; this one runs the search through
that launcher, so its trials run wherever the user's jobs run: the speed features' walk
(speed/search.py), the time-to-target study (time_to_target.py), or both, one after the other
(``autotune.stages``: pipeline.py); then it writes the answer into the sweep directory:

- ``conf/experiment/recipe.yaml``: the recipe, a preset for the full run (report/recipe.py);
- ``autotune.md``, ``autotune.png``: the path the search took, each candidate's speed-up
  with its interval, memory, why each rejected one was rejected, the projection;
- ``autotune.json``: all of it, for scripts (report/record.py).

Hydra instantiates sweepers only from the ``hydra_plugins`` package:
``hydra_plugins/tuneup_autotune`` holds the class Hydra sees, which hands over to this one.
"""

from __future__ import annotations

import logging
import shlex
from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from tuneup import TuneupError
from tuneup.autotune.pipeline import speed_line
from tuneup.autotune.preflight import check_command
from tuneup.autotune.race import TIME_TO_TARGET, race_settings
from tuneup.autotune.report.recipe import RELATIVE_PATH, recipe_overrides, write_recipe
from tuneup.autotune.report.record import build_record, write_record
from tuneup.autotune.settings import SPEED, STUDY, Settings
from tuneup.autotune.space import Checks
from tuneup.autotune.speed import projection as projections
from tuneup.autotune.speed.budget import Budget
from tuneup.autotune.speed.search import Search
from tuneup.autotune.trials import Lab, trial_settings
from tuneup.errors import user_errors

log = logging.getLogger(__name__)


class Autotune:
    def setup(self, *, hydra_context, task_function, config) -> None:
        from hydra.core.plugins import Plugins

        self.config, self.hydra_context = config, hydra_context
        with user_errors():
            self.settings = Settings.from_config(config)
        self.launcher = Plugins.instance().instantiate_launcher(
            config=config, hydra_context=hydra_context, task_function=task_function
        )

    def sweep(self, arguments: list[str]):
        stages = self.settings.run_stages
        study = STUDY in stages
        with user_errors():
            command, sweeps = split_command(arguments) if study else (single_command(arguments), [])
            trial = race_settings() if study else trial_settings(self.settings.trial_steps)
            # the speed stage alone of a time-to-target search: its trials do not validate
            line = speed_line(command) if stages == (SPEED,) and self.target else command
            checks = Checks(lambda overrides: self.compose([*line, *trial, *overrides]))
            check_command(checks, sweeps, study)  # nothing written yet: a refusal loses nothing
        sweep_dir = Path(self.config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        budget = Budget(self.settings.budget_seconds)
        trials = (
            "an Optuna study of trials to the target"
            if study
            else f"trials of {self.settings.trial_steps} steps"
        )
        log.info(
            "autotune: budget %g min, stages %s (%s), into %s",
            self.settings.budget_minutes,
            ", ".join(stages),
            trials,
            sweep_dir,
        )
        if study:
            return self.sweep_study(command, sweeps, sweep_dir, budget, SPEED in stages)
        with user_errors():
            search = Search(self.settings, self.lab(sweep_dir, line), checks, budget).run()
        self.answer(search, command, sweep_dir)
        return search

    def sweep_study(self, command, sweeps, sweep_dir: Path, budget: Budget, speed_first: bool):
        """The time-to-target study, after the speed stage when ``speed_first``, on the
        user's command plus the speed stage's recipe (pipeline.py)."""
        from tuneup.autotune import pipeline
        from tuneup.autotune.time_to_target import StudySearch
        from tuneup.optuna.study import resolve_storage

        with user_errors():
            seed = int(self.compose(command).get("seed") or 0)
            storage = resolve_storage(self.settings.storage, sweep_dir)
            search = StudySearch(
                self.settings,
                self.lab(sweep_dir, command),
                self.study_checks(command),
                budget,
                seed,
                storage,
                sweeps,
                self.is_group,
            )
            speed = None
            if speed_first:
                speed = pipeline.speed_then_study(
                    self.settings,
                    search,
                    lambda seconds: pipeline.run_speed(
                        self.settings,
                        self.launcher,
                        sweep_dir,
                        command,
                        self.compose,
                        next_job(sweep_dir),
                        seconds,
                    ),
                    lambda recipe: self.study_on([*command, *recipe], sweep_dir),
                )
            search.run()
            if search.answered_by is None:  # else another sweeper on the study answers
                self.answer_study(search, command, sweep_dir, speed)
        return search

    def study_checks(self, command: list[str]) -> Checks:
        """The study's checks: ``command`` as its runs have it (race settings included), each
        trial's values applied to a composition of its config groups (composed.py)."""
        from tuneup.autotune.composed import GroupComposer

        repository = self.hydra_context.config_loader.repository
        return Checks(
            GroupComposer(self.compose, [*command, *race_settings()], repository.group_exists)
        )

    def study_on(self, command: list[str], sweep_dir: Path) -> tuple[Lab, Checks]:
        """Where the study runs after the speed stage: ``command`` (yours and its recipe)."""
        return self.lab(sweep_dir, command), self.study_checks(command)

    def lab(self, sweep_dir: Path, command: list[str]) -> Lab:
        """Where a stage's trials run: the sweep's launcher, numbered after the jobs there."""
        return Lab(
            self.launcher,
            sweep_dir,
            command,
            self.settings.trial_steps,
            first_job=next_job(sweep_dir),
        )

    @property
    def target(self) -> bool:
        return self.settings.objective == TIME_TO_TARGET

    def compose(self, overrides: list[str]):
        """The config a job with these overrides gets (Hydra's own loader: the user's
        --config-dir, ./conf and installed plugins' groups included)."""
        return self.hydra_context.config_loader.load_sweep_config(self.config, overrides)

    def answer(self, search: Search, command: list[str], sweep_dir: Path) -> None:
        from tuneup.autotune.report.markdown import render_markdown

        overrides = recipe_overrides(command, search.recipe)
        header = [
            f"tuneup autotune, {search.baseline.figure('device')}: {sweep_dir / 'autotune.md'}",
            "the full run: tuneup --config-dir <this file's conf folder> experiment=recipe",
        ]
        path = write_recipe(sweep_dir, overrides, self.is_group, header)
        recipe = {
            "overrides": overrides,
            "file": str(RELATIVE_PATH),
            "command": f"tuneup --config-dir {shlex.quote(str(path.parents[1]))} experiment=recipe",
        }
        record = build_record(search, command, recipe, self.projection(search, command))
        write_answer(
            sweep_dir, record, render_markdown(record, sweep_dir), path, "report.figure.draw_figure"
        )
        log.info("autotune: the full run: %s", recipe["command"])

    def answer_study(self, search, command: list[str], sweep_dir: Path, speed=None) -> None:
        """The answer of the study (and of the speed stage before it, ``speed``: its Search)."""
        from tuneup.autotune.pipeline import stages_record
        from tuneup.autotune.report.markdown import MARKDOWN_FILE
        from tuneup.autotune.report.study_markdown import render_study_markdown
        from tuneup.autotune.report.study_record import build_study_record

        found = (*(speed.recipe if speed else ()), *search.recipe)
        overrides = recipe_overrides(command, found)
        header = [
            f"tuneup autotune (time to target): {sweep_dir / MARKDOWN_FILE}",
            "the full run: tuneup --config-dir <this file's conf folder> experiment=recipe "
            "target.stop=true",
        ]
        path = write_recipe(sweep_dir, overrides, self.is_group, header)
        recipe = {
            "overrides": overrides,
            "file": str(RELATIVE_PATH),
            "command": f"tuneup --config-dir {shlex.quote(str(path.parents[1]))} experiment=recipe "
            "target.stop=true",
        }
        record = build_study_record(search, command, recipe)
        record["recipe"]["found"] = list(found)
        record["stages"] = stages_record(self.settings, speed, search)
        markdown = render_study_markdown(record, sweep_dir)
        write_answer(sweep_dir, record, markdown, path, "report.study_figure.draw_study_figure")
        log.info("autotune: %s", record["verdict"])
        log.info("autotune: the full run: %s", recipe["command"])

    def projection(self, search: Search, command: list[str]) -> dict:
        full = self.compose(command)
        baseline = [t.summary for t in search.lab.trials if t.label == "baseline" and t.ok]
        effective = baseline[0].get("effective_batch_size") if baseline else None
        samples, source = projections.full_run(
            self.settings, full, effective, lambda: training_set_size(full)
        )
        confirmation = search.confirmation
        recipe = [t.summary for t in (confirmation.trials if confirmation else []) if t.ok]
        interval = confirmation.interval(self.settings.confidence) if confirmation else None
        measured = baseline[1:] or baseline  # the first trial also warmed the process up
        return projections.project(samples, source, measured, recipe, interval)

    def is_group(self, key: str) -> bool:
        return bool(self.hydra_context.config_loader.get_group_options(key))


def single_command(arguments: list[str]) -> list[str]:
    """The user's overrides; a sweep of values (``a=1,2``) is refused: the autotune has one
    starting point, and it sweeps the features itself."""
    for override in OverridesParser.create().parse_overrides(list(arguments)):
        if override.is_sweep_override():
            raise TuneupError(
                f"{override.input_line}: experiment=autotune takes one command, not a sweep of "
                "values; give one value (the autotune searches the features itself)"
            )
    return list(arguments)


def split_command(arguments: list[str]) -> tuple[list[str], list[str]]:
    """The user's overrides and their sweeps (``model.lr='tag(log, interval(1e-3, 1))'``),
    which the time-to-target study searches as hparams_search=optuna would."""
    command, sweeps = [], []
    for override in OverridesParser.create().parse_overrides(list(arguments)):
        (sweeps if override.is_sweep_override() else command).append(override.input_line)
    return command, sweeps


def next_job(sweep_dir: Path) -> int:
    """The first job number no folder of the sweep directory has (a continued search)."""
    numbers = [int(p.name) for p in Path(sweep_dir).iterdir() if p.is_dir() and p.name.isdigit()]
    return max(numbers, default=-1) + 1


def training_set_size(cfg) -> int | None:
    """Samples in the training set (the data module is set up; nothing else is built)."""
    from tuneup.trainer.components import Plan

    try:
        data = Plan(cfg).data
        data.setup("fit")
        return len(data.train_set)
    except Exception as exc:  # the user's data may need more than setup: no projection then
        log.info("autotune: the training set's size is unknown (%s)", exc)
        return None


def write_answer(sweep_dir: Path, record: dict, markdown: str, recipe: Path, drawing: str) -> None:
    """autotune.json, autotune.md and, where matplotlib is installed, autotune.png (drawn by
    ``drawing``, ``module.function`` under tuneup.autotune: imported here, as it needs it)."""
    import importlib

    from tuneup.autotune.report.markdown import MARKDOWN_FILE

    write_record(sweep_dir, record)
    (sweep_dir / MARKDOWN_FILE).write_text(markdown)
    written = [recipe, sweep_dir / MARKDOWN_FILE]
    module, function = drawing.rsplit(".", 1)
    try:
        draw = getattr(importlib.import_module(f"tuneup.autotune.{module}"), function)
    except ImportError:
        log.warning("autotune.png not drawn: it needs matplotlib (pip install 'tuneup[sweep]')")
    else:
        written.append(draw(record, sweep_dir / "autotune.png"))
    log.info("autotune: %s", ", ".join(str(p) for p in written))
