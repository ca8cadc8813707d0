"""autotune.stages (issue 48 point 4): with autotune.objective=time_to_target, one command runs
the speed features' walk on the user's command, then the study on top of its recipe; the
answer holds both stages and what each bought."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

import tuneup
from tests.conftest import run_cli
from tests.plugin_dists import make_distribution
from tests.test_autotune_study import TASK
from tests.test_study_budget import ClockLab
from tuneup.autotune.pipeline import SKIPPED, SpeedStage, speed_record, speed_then_study
from tuneup.autotune.settings import Settings
from tuneup.autotune.speed.search import Budget
from tuneup.autotune.time_to_target import StudySearch
from tuneup.autotune.trials import Trial
from tuneup.stats.interval import paired

pytest.importorskip("optuna")

# -- autotune.stages: what each objective allows ----------------------------------------------


@pytest.mark.parametrize(
    ("objective", "stages", "message"),
    [
        ("time_to_target", ["speed", "bogus"], "autotune.stages=[speed,bogus] is not allowed "
         "with autotune.objective=time_to_target: expected [speed,study] | [study] | [speed]"),
        ("time_to_target", ["study", "speed"], "autotune.stages=[study,speed] is not allowed "
         "with autotune.objective=time_to_target: expected [speed,study] | [study] | [speed]"),
        ("throughput", ["study"], "autotune.stages=[study] is not allowed with "
         "autotune.objective=throughput: expected [speed] (the study needs "
         "autotune.objective=time_to_target)"),
    ],
    ids=["unknown", "reversed", "study-without-target"],
)  # fmt: skip
def test_bad_stages_are_one_line_errors(objective, stages, message):
    node = OmegaConf.create({"autotune": {"objective": objective, "stages": stages}})
    with pytest.raises(tuneup.TuneupError) as caught:
        Settings.from_config(node)
    assert str(caught.value) == f"autotune settings: {message}"


def test_the_stages_default_to_the_objectives():
    node = OmegaConf.create({"autotune": {"objective": "time_to_target", "stages": None}})
    assert Settings.from_config(node).run_stages == ("speed", "study")
    node = OmegaConf.create({"autotune": {"objective": "time_to_target", "stages": ["study"]}})
    assert Settings.from_config(node).run_stages == ("study",)
    assert Settings().run_stages == ("speed",)  # the throughput objective


def _trial(job: int, speed: float):
    summary = {
        "status": "ok",
        "samples_per_s_windows": [speed / 2, speed],
        "effective_batch_size": 32,
    }
    return Trial("x", (), str(job), Path("/nowhere"), summary, 1.0)


def test_what_the_speed_stage_buys_is_the_baselines_steps_at_each_ones_seconds_per_step():
    """The study's baseline reached the target in 50 steps; the speed stage's confirmation
    measured your command at 100 samples/s and the recipe at 200 (batch 32)."""
    contest = SimpleNamespace(
        reference_trials=[_trial(1, 100.0), _trial(3, 100.0)],
        trials=[_trial(2, 200.0), _trial(4, 200.0)],
        interval=lambda confidence: paired([100.0, 100.0], [200.0, 200.0], confidence),
    )
    search = SimpleNamespace(
        settings=Settings(dimensions=("precision",)),
        recipe=("precision=bf16",),
        confirmation=contest,
        budget=Budget(60),
        outcomes=[],
        batch_notes=[],
        lab=SimpleNamespace(trials=[]),
    )
    found = speed_record(SpeedStage(search, 12.0), {"reached": True, "steps_to_target": 50})
    assert found["seconds_per_step"] == {"command": 0.32, "recipe": 0.16}
    assert found["time_to_target_s"] == pytest.approx({"command": 16.0, "recipe": 8.0})
    assert found["time_ratio"]["estimate"] == pytest.approx(0.5) and found["reached"]
    assert found["adopted"] == ["precision=bf16"] and found["elapsed_seconds"] == 12.0
    nothing = SimpleNamespace(**{**vars(search), "recipe": ()})
    found = speed_record(SpeedStage(nothing, 12.0), {"reached": True, "steps_to_target": 50})
    assert found["adopted"] == [] and found["time_to_target_s"] == {"command": None, "recipe": None}


def test_the_speed_stage_alone_is_the_throughput_answer_on_a_command_with_a_target(tmp_path):
    """autotune.stages=[speed] of a time-to-target search: its throughput trials run without
    the target (they do not validate), the recipe keeps it; the smallest search: a baseline."""
    sweep_dir = tmp_path / "sweep"
    done = run_cli(
        "-m",
        "experiment=autotune",
        "autotune.objective=time_to_target",
        "autotune.stages=[speed]",
        "autotune.dimensions=[]",
        "autotune.trial_steps=4",
        f"hydra.sweep.dir={sweep_dir}",
        *TASK,
        cwd=tmp_path,
        tiny=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    record = json.loads((sweep_dir / "autotune.json").read_text())
    assert "method" not in record and record["recipe"]["found"] == []  # the throughput record
    assert [t["label"] for t in record["trials"]] == ["baseline"]
    assert "target.metric=null" in _overrides(sweep_dir, 0)
    cfg = tuneup.compose(["experiment=recipe"], config_dir=sweep_dir / "conf")
    assert cfg.target.metric == "val/acc" and cfg.target.value == 0.8


# -- the budget between the stages: the study's need first (made-up clocks, no runs) -----------


def study_search(tmp_path, minutes: float, run_s: float):
    """A StudySearch on a made-up clock whose runs take ``run_s`` and reach the target
    (test_study_budget.ClockLab); its config: the digits task, composed in process."""
    settings = Settings(
        objective="time_to_target",
        budget_minutes=minutes,
        budget_trials=1000,
        cost="steps",
        workers=1,
        params={"optimizer.lr": "tag(log, interval(0.001, 0.1))"},
    )
    now = [0.0]
    config = tuneup.compose(TASK)
    checks = SimpleNamespace(
        inspect=lambda overrides: SimpleNamespace(ok=True, problems=(), config=config)
    )
    lab = ClockLab(now, run_s, tmp_path / "sweep")
    lab.launcher = None
    budget = Budget(settings.budget_seconds, clock=lambda: now[0])
    search = StudySearch(settings, lab, checks, budget, 0, str(tmp_path / "optuna.journal"))
    return settings, search, now, checks


def test_a_tight_budget_skips_the_speed_stage_and_the_study_still_answers(tmp_path):
    """2 minutes, runs of 12 s (a loaded machine): the study needs a trial and one
    confirmation (84 s) after its 12 s baseline; a third for the speed stage would leave it
    less than that with a spare: the speed stage does not run, the study does, and answers."""
    settings, search, _, checks = study_search(tmp_path, 2, 12.0)
    asked = []
    speed = speed_then_study(settings, search, asked.append, lambda recipe: (None, checks))
    assert speed is None and asked == [] and search.notes == [SKIPPED]
    search.run()
    assert len(search.explored()) >= 1 and search.verdict
    assert search.lab.trials[0].label == "baseline" and search.baseline["job"] == "0"
    assert search.budget.elapsed <= search.budget.seconds


def test_a_budget_too_small_for_the_study_alone_is_refused_before_the_speed_stage(tmp_path):
    settings, search, _, checks = study_search(tmp_path, 2, 40.0)
    asked = []
    with pytest.raises(tuneup.TuneupError) as refused:
        speed_then_study(settings, search, asked.append, lambda recipe: (None, checks))
    assert str(refused.value) == (
        "autotune.budget_minutes=2 is too small for this command: its baseline took 40 s; "
        "one study trial and a confirmation need about 4 more minute(s); give at least "
        "autotune.budget_minutes=5"
    )
    assert asked == [] and [t.label for t in search.lab.trials] == ["baseline"]


def test_the_speed_stage_gets_its_third_and_the_study_reruns_its_baseline_on_the_recipe(
    tmp_path,
):
    """Runs of 3 s: the study's need leaves the speed stage its whole third (40 s). Its
    recipe adopted, the study's baseline runs again on command + recipe (its reference);
    without a recipe, the first baseline is the study's, not run again."""
    for recipe, baselines in ((("trainer.log_every_n_steps=7",), 2), ((), 1)):
        settings, search, now, checks = study_search(tmp_path / str(len(recipe)), 2, 3.0)
        asked, moved = [], ClockLab(now, 3.0, tmp_path / "sweep")
        moved.launcher = None

        def stage(seconds, asked=asked, recipe=recipe):
            asked.append(seconds)
            return SimpleNamespace(recipe=recipe, seconds=seconds)

        speed_then_study(
            settings, search, stage, lambda found, moved=moved, checks=checks: (moved, checks)
        )
        assert asked == [40.0] and search.lab is moved
        assert [t.label for t in moved.trials] == ["baseline"]
        assert len([t for t in search.lab.trials if t.label == "baseline"]) == 1
        assert now[0] == 3.0 * baselines  # the second baseline only on a recipe
        assert search.baseline["job"] == moved.trials[0].job


def test_a_continued_study_keeps_its_stored_baseline_after_the_speed_stage(tmp_path):
    """A study run again on its storage: its stored baseline tells the study's need (nothing
    runs before the speed stage) and stays its reference after a recipe (not run again)."""
    study_search(tmp_path, 2, 3.0)[1].prepare()  # the first search: its baseline stored
    settings, search, now, checks = study_search(tmp_path, 2, 3.0)
    moved = ClockLab(now, 3.0, tmp_path / "sweep")
    moved.launcher = None

    def stage(seconds):
        return SimpleNamespace(recipe=("trainer.log_every_n_steps=7",), seconds=seconds)

    speed_then_study(settings, search, stage, lambda recipe: (moved, checks))
    assert now[0] == 0.0 and moved.trials == [] and search.lab is moved
    assert search.baseline["job"] == "0" and search.continued


def test_a_budget_too_small_for_the_study_is_refused_before_any_speed_trial(tmp_path):
    """The command line: your command's run to the target (job 0, one epoch of the task: the
    refusal follows whatever job 0 took), then one error line with the least budget; no
    throughput trial of the speed stage was launched."""
    sweep_dir = tmp_path / "sweep"
    done = run_cli(
        "-m",
        "experiment=autotune",
        "autotune.objective=time_to_target",  # autotune.stages: the default, [speed,study]
        "autotune.budget_minutes=0.1",
        f"hydra.sweep.dir={sweep_dir}",
        *TASK,
        "trainer.max_epochs=1",  # the refusal follows job 0's run, whatever its length
        cwd=tmp_path,
        tiny=False,
    )
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    [error] = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert error.startswith("error: autotune.budget_minutes=0.1 is too small for this command: ")
    assert "give at least autotune.budget_minutes=" in error
    assert sorted(p.name for p in sweep_dir.iterdir() if p.is_dir()) == ["0"]
    assert "target.stop=true" in _overrides(sweep_dir, 0)  # the run to the target, not speed


class SlowingLab:
    """Throughput trials on a made-up clock, each ``growth`` x slower than the one before
    (a machine whose load rises), ``start_s`` of each outside its ``trainer.max_time``."""

    def __init__(self, first_s: float, growth: float, start_s: float = 2.0) -> None:
        self.now, self.first_s, self.growth, self.start_s = [0.0], first_s, growth, start_s
        self.trials: list[Trial] = []
        self.ends: list[float] = []

    def run(self, label, overrides, steps=None, limit_s=None, settings=None, worker=None):
        seconds = self.first_s * self.growth ** len(self.trials)
        if limit_s is not None:
            seconds = min(seconds, self.start_s + limit_s)
        self.now[0] += seconds
        self.ends.append(self.now[0])
        summary = {"status": "ok", "samples_per_s_windows": [100.0 + len(self.trials) % 3]}
        if label != "baseline":  # the guard's curve: none for the reference, nothing to compare
            summary["loss_curve"] = {"loss": [1.0]}
        trial = Trial(label, tuple(overrides), str(len(self.trials)), Path("/x"), summary, seconds)
        self.trials.append(trial)
        return trial


def test_the_speed_stages_trials_end_within_its_share_on_a_slowing_machine():
    """A 40 s share, trials of 3 s growing by a quarter each (two candidates as fast as the
    command: undecided, they would take every round): no trial ends past the share."""
    from tuneup.autotune.space import Candidate
    from tuneup.autotune.speed.search import Search

    lab = SlowingLab(3.0, 1.25)
    checks = SimpleNamespace(inspect=lambda overrides: SimpleNamespace(config={}))
    budget = Budget(40.0, clock=lambda: lab.now[0])
    search = Search(Settings(min_rounds=2, max_rounds=6), lab, checks, budget)
    search.baseline = lab.run("baseline", ())
    candidates = [Candidate("fast", ("a=1",)), Candidate("fast", ("a=2",))]
    contests = search.rounds((), candidates, 6)
    assert len(lab.trials) > 3 and max(lab.ends) <= 40.0, lab.ends
    assert any(c.cut_short for c in contests)


def test_a_first_compile_is_not_started_where_its_compilation_cannot_fit():
    """compile=on's first step holds the compilation, which trainer.max_time cannot cut: in a
    40 s share its first trial is planned at a minute, so it is not launched (cut short)."""
    from tuneup.autotune.space import Candidate
    from tuneup.autotune.speed.search import FIRST_COMPILE_S, Search

    lab = SlowingLab(3.0, 1.0)
    checks = SimpleNamespace(inspect=lambda overrides: SimpleNamespace(config={}))
    search = Search(Settings(), lab, checks, Budget(40.0, clock=lambda: lab.now[0]))
    search.baseline = lab.run("baseline", ())
    assert search.estimate(("compile=on",)) == FIRST_COMPILE_S
    assert search.estimate(("compile=off",)) == 3.0
    [contest] = search.rounds((), [Candidate("compile", ("compile=on",))], 4)
    assert contest.cut_short and not contest.trials
    assert "compile=on" not in [t.label for t in lab.trials]


# -- one real pipeline: the speed stage adopts a known 3x, the study runs on top of it ---------

#: Every trial's speed windows replaced by a known speed: 3x with the speed stage's candidate
#: (a harmless trainer setting), so that it is adopted on a loaded machine.
KNOWN_SPEEDS = """
from tuneup import hookimpl


class Plugin:
    def __init__(self, cfg):
        self.speed = 300.0 if cfg.trainer.log_every_n_steps == 7 else 100.0

    @hookimpl(trylast=True)
    def report(self, summary):
        windows = summary.get("samples_per_s_windows") or []
        summary["samples_per_s_windows"] = [self.speed] * len(windows)
"""
FAST = "trainer.log_every_n_steps=7"
#: The study's one trial: a learning rate 10x the command's, which needs fewer steps.
PICK = "optimizer.lr=0.05"


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    folder = tmp_path_factory.mktemp("stages")
    site = make_distribution(
        folder / "site",
        "known-speeds",
        {"known_speeds": KNOWN_SPEEDS},
        {"known": "known_speeds:Plugin"},
    )
    sweep_dir = folder / "sweep"
    done = run_cli(
        "-m",
        "experiment=autotune",
        "autotune.objective=time_to_target",  # autotune.stages: the default, [speed,study]
        "autotune.budget_trials=1",
        "autotune.seeds=2",
        "autotune.max_seeds=2",
        "autotune.confirm=1",
        "autotune.trial_steps=4",
        "autotune.max_rounds=2",
        "autotune.cost=steps",
        "autotune.params={optimizer.lr: 'choice(0.05)'}",
        f"+autotune.space.fast=['{FAST}']",
        "autotune.dimensions=[fast,batch_size]",  # the batch is the study's: not walked
        f"hydra.sweep.dir={sweep_dir}",
        *TASK,
        cwd=folder,
        tiny=False,
        timeout=600,
        env={"PYTHONPATH": str(site)},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    record = json.loads((sweep_dir / "autotune.json").read_text())
    return {"dir": sweep_dir, "record": record, "done": done}


def _overrides(sweep_dir, job) -> list[str]:
    return list(OmegaConf.load(sweep_dir / str(job) / ".hydra" / "overrides.yaml"))


def test_the_speed_stage_runs_first_and_every_study_run_has_its_recipe(pipeline):
    sweep_dir, record = pipeline["dir"], pipeline["record"]
    speed = record["stages"]["speed"]
    assert record["stages"]["run"] == ["speed", "study"]
    assert speed["dimensions"] == ["fast"] and speed["adopted"] == [FAST]
    assert speed["speed_up"]["estimate"] == pytest.approx(3.0)
    speed_jobs = [int(t["job"]) for t in speed["trials"]]
    study_jobs = [int(t["job"]) for t in record["trials"]]
    # job 0: your command to its target first, the study's need known before the speed stage
    assert FAST not in _overrides(sweep_dir, 0) and "target.stop=true" in _overrides(sweep_dir, 0)
    assert speed_jobs == list(range(1, len(speed_jobs) + 1))
    assert min(study_jobs) == len(speed_jobs) + 1  # the baseline again, on the recipe
    assert record["baseline"]["job"] == str(min(study_jobs))
    for job in speed_jobs:  # throughput trials of the user's command: no target, no validation
        assert "trainer.max_steps=4" in _overrides(sweep_dir, job)
    for job in study_jobs:  # the study's baseline, trial, confirmation and speed runs
        assert FAST in _overrides(sweep_dir, job), job
    # what the speed stage bought: the study baseline's steps x each one's seconds per step
    # (here it misses the target within its 3 epochs: the steps it ran)
    assert not record["baseline"]["reached"] and speed["reached"] is False
    steps = record["baseline"]["steps"]
    per_step, times = speed["seconds_per_step"], speed["time_to_target_s"]
    batch = json.loads((sweep_dir / "0" / "summary.json").read_text())["effective_batch_size"]
    assert per_step == pytest.approx({"command": batch / 100, "recipe": batch / 300})
    assert speed["steps_to_target"] == steps
    assert times == pytest.approx({"command": steps * batch / 100, "recipe": steps * batch / 300})
    assert speed["time_ratio"]["estimate"] == pytest.approx(1 / 3)


def test_the_answer_holds_both_stages(pipeline):
    sweep_dir, record = pipeline["dir"], pipeline["record"]
    study = record["stages"]["study"]
    assert study["adopted"] == [PICK] and record["recipe"]["found"] == [FAST, PICK]
    assert study["verdict"] == record["verdict"]
    text = (sweep_dir / "autotune.md").read_text()
    assert f"**Recipe: `{FAST} {PICK}`**" in text
    assert "## Stages" in text and "1. **Speed** (5 throughput trials over fast; " in text
    assert (
        f"the study has the rest): adopted `{FAST}`: 3x [3, 3] your command's speed" in text
        and "0.333x [0.333, 0.333] your command's" in text
    )
    study_line = (
        "2. **Study** (on your command with the speed stage's recipe: its `baseline` below)"
    )
    assert f"{study_line}: adopted `{PICK}`: estimated time to target " in text
    cfg = tuneup.compose(["experiment=recipe", "target.stop=true"], config_dir=sweep_dir / "conf")
    assert cfg.trainer.log_every_n_steps == 7 and cfg.optimizer.lr == pytest.approx(0.05)
    assert cfg.target.value == 0.8 and "autotune" not in cfg


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__]))
