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
from tuneup.autotune.pipeline import SpeedStage, speed_record
from tuneup.autotune.settings import Settings
from tuneup.autotune.speed.search import Budget
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
    assert speed_jobs == list(range(len(speed_jobs))) and min(study_jobs) == len(speed_jobs)
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
