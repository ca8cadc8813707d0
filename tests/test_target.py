"""Time to a target (plugins/target/) with the race techniques on, and across a kill -9.

One uninterrupted run (label smoothing, no decay on norms and biases, flip TTA, all on)
stops when val/acc reaches the target; the same run killed with -9 mid-way and resumed
reports the same steps and samples to target and the killed session's history and clock.
"""

from __future__ import annotations

import json
import signal

import pytest
import torch

import tuneup
from tests.conftest import compose_config, run_cli
from tests.plugin_dists import make_distribution
from tuneup.plugins.target import Race, direction
from tuneup.trainer.state.checkpoint_read import load as load_checkpoint

#: 4 steps an epoch, validation every 2 steps; the easy data reach val/acc 0.55 in epoch 2.
RUN = [
    "data.train_samples=128",
    "data.val_samples=64",
    "data.batch_size=32",
    "data.signal=0.3",
    "model=mlp",
    "model.hidden=[16]",
    "trainer.max_epochs=4",
    "trainer.enable_progress_bar=false",
    "measure.console_table=false",
    "target.metric=val/acc",
    "target.value=0.55",
    "target.check_every_n_steps=2",
    "target.stop=true",
    "label_smoothing=on",
    "weight_decay=skip_norms_biases",
    "tta=flip",
]

CRASH = """
import os, signal
from tuneup import hookimpl

class Plugin:
    micro_batches = 0

    @hookimpl
    def on_after_backward(self):
        Plugin.micro_batches += 1
        if Plugin.micro_batches == int(os.environ["CRASH_AT_MICRO_BATCH"]):
            os.kill(os.getpid(), signal.SIGKILL)
"""


def summary_of(run_dir) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("reference")
    tuneup.run(compose_config(RUN, tiny=False), run_dir=run_dir)
    return summary_of(run_dir)


def test_the_run_stops_at_the_target_with_its_figures(reference):
    s = reference
    assert s["status"] == "ok"
    assert s["target"]["reached"] is True and s["target"]["mode"] == "max"
    assert s["steps"] == s["steps_to_target"] < 16  # stopped there, before max_epochs=4
    assert s["checkpoints"]["last"].endswith(f"step{s['steps']:08d}.ckpt")  # the final one
    history = s["target_history"]
    assert [h["step"] for h in history] == list(range(2, s["steps"] + 1, 2))
    assert history[-1]["value"] >= 0.55 > max(h["value"] for h in history[:-1])
    assert s["samples_to_target"] == s["steps"] * 32 == history[-1]["samples"]
    assert s["validations"] == len(history) and s["validation_time_s"] > 0
    assert s["time_to_target_s"] == history[-1]["time_s"] > s["time_to_target_train_s"] > 0
    assert s["device_hours_to_target"] == pytest.approx(s["time_to_target_s"] / 3600)
    assert s["gpu_hours_to_target"] == 0.0 == s["gpu_hours"]  # a CPU's hours are no GPU's
    assert s["energy_kwh_to_target"] is None  # no NVML counter on CPU
    plugins = s["plugins"]
    assert plugins["label_smoothing"]["amount"] == 0.1 and plugins["tta"]["name"] == "flip"
    assert plugins["weight_decay"]["no_decay_tensors"] > 0


def test_figures_survive_a_kill_9_and_resume(tmp_path, reference):
    site = make_distribution(
        tmp_path / "site",
        "tuneup-crash-target",
        {"crash_target": CRASH},
        {"crash_target": "crash_target:Plugin"},
    )
    run_dir = tmp_path / "run"
    env = {"PYTHONPATH": str(site), "CRASH_AT_MICRO_BATCH": "5"}  # epoch 2, before the target
    result = run_cli(f"hydra.run.dir={run_dir}", *RUN, tiny=False, env=env)
    assert result.returncode == -signal.SIGKILL, result.stderr[-3000:]
    saved = load_checkpoint(run_dir / "checkpoints" / "epoch000-step00000004.ckpt")
    first = saved["tuneup"]["target"]  # the killed session's figures at its last checkpoint

    tuneup.run(compose_config([*RUN, "resume=auto"], tiny=False), run_dir=run_dir)
    s = summary_of(run_dir)
    assert s["status"] == "ok" and s["target"]["reached"] is True
    for key in ("steps_to_target", "samples_to_target", "validations"):
        assert s[key] == reference[key], key
    history = s["target_history"]
    assert history[: len(first["history"])] == first["history"]  # continued, not restarted
    assert [h["value"] for h in history] == [h["value"] for h in reference["target_history"]]
    assert s["time_to_target_s"] > first["time_s"]  # the first session's time is in it
    assert s["validation_time_s"] > first["validation_s"]


def test_direction_from_the_metric_name():
    assert direction("val/acc") == direction("val_top1") == direction("val/accuracy") == "max"
    assert direction("val/loss") == direction("val/perplexity") == direction("error") == "min"
    assert direction("val/thing") is None and direction("val/thing", "min") == "min"


def test_a_target_outside_a_fraction_metrics_range_is_refused(make_config):
    """val/acc 1.5 (or -0.1) would train to "not reached": one line with the allowed range;
    a loss has no such range."""
    from tuneup.plugins.target.plugin import settings_problems

    cfg = make_config([])  # one composition, its target set in turn

    def problems(metric, value):
        cfg.target.metric, cfg.target.value = metric, value
        return settings_problems(cfg)

    for value in (1.5, -0.1):
        assert problems("val/acc", value) == [
            f"target.value={value} is not allowed: expected a number in [0, 1]: "
            "target.metric=val/acc is a fraction by its name (acc, top1, f1...), e.g. 0.9"
        ]
    for metric, value in (("val/acc", 1), ("val_top1", 0.0), ("val/loss", 1.5)):
        assert problems(metric, value) == []
    assert len(problems("val_f1", 90)) == 1


def test_race_record_and_resume_with_a_fake_clock():
    now = [0.0]
    race = Race("val/loss", 1.0, "min", clock=lambda: now[0])
    race.start()
    now[0] = 10.0
    race.add_samples(64)
    race.validation_start()
    now[0] = 12.0
    assert race.validation_end(step=2, value=1.5) is False
    saved = race.state_dict()  # a checkpoint at 12 s; the session goes on and is killed
    now[0] = 20.0
    assert race.validation_end(step=4, value=0.9) is True

    resumed = Race("val/loss", 1.0, "min", clock=lambda: now[0])
    resumed.load_state_dict(saved)
    now[0] = 100.0  # start-up of the new session: not counted
    resumed.start()
    now[0] = 105.0
    resumed.validation_start()
    now[0] = 106.0
    assert resumed.validation_end(step=4, value=0.8) is True
    figures = resumed.figures(world_size=2, gpu=True)
    assert figures["time_to_target_s"] == 12.0 + 6.0 and figures["validation_time_s"] == 3.0
    assert figures["time_to_target_train_s"] == 15.0 and figures["steps_to_target"] == 4
    assert figures["device_hours_to_target"] == 18.0 * 2 / 3600 == figures["gpu_hours_to_target"]
    assert resumed.figures(world_size=2, gpu=False)["gpu_hours_to_target"] == 0.0
    assert figures["target"] == {
        "metric": "val/loss",
        "value": 1.0,
        "mode": "min",
        "reached": True,
        "best": 0.8,
        "best_step": 4,
    }

    budget = Race("val/loss", None, "min")  # a budget run: the best within it, no target
    budget.load_state_dict(saved)
    assert budget.figures(1)["target"]["reached"] is None
    assert budget.figures(1)["target"]["best"] == 1.5


def test_bad_settings_are_one_line_each(make_config, tmp_path):
    from tuneup.trainer.runner import ConfigError

    bad = [
        "model=gpt",
        "data=synthetic_tokens",
        "target.metric=val/acc_top9",
        "target.mode=sideways",
        "target.check_every_n_steps=0",
        "target.stop=yes",
        "target.max_samples=0",
        "tta=flip",
        "label_smoothing=on",
        "label_smoothing.amount=1.5",
    ]
    with pytest.raises(ConfigError) as error:
        tuneup.run(make_config(bad), run_dir=tmp_path)
    text = str(error.value)
    for expected in (
        "target.mode='sideways' is not allowed: expected one of 'auto', 'max'",
        "target.check_every_n_steps=0 is not allowed",
        "target.stop='yes' is not allowed",
        "target.max_samples=0 is not allowed",
        "label_smoothing.amount=1.5 is not allowed",
        "tta=flip flips images left to right, but data synthetic_tokens",
    ):
        assert expected in text, text
    with pytest.raises(ConfigError) as error:
        tuneup.run(make_config(["target.metric=val/f1"]), run_dir=tmp_path / "f1")
    logged = (
        "target.metric=val/f1 is not logged by this run: task=classification logs val/loss, val/acc"
    )
    assert logged in str(error.value)


def test_the_cadence_counts_optimizer_steps_under_accumulation(make_config):
    from tuneup.plugins.target import Plugin

    plugin = Plugin(make_config(["target.metric=val/loss", "target.check_every_n_steps=5"]))
    kwargs = {"accumulate_grad_batches": 3}  # as grad_accum's configure_trainer left them
    plugin.configure_trainer(kwargs)
    assert kwargs == {
        "accumulate_grad_batches": 3,
        "val_check_interval": 15,
        "check_val_every_n_epoch": None,
    }


def test_a_long_runs_history_stays_within_its_limit_spanning_the_run():
    from tuneup.plugins.target.race import HISTORY_LIMIT

    race = Race("val/acc", 0.5, "max", clock=lambda: 0.0)
    for step in range(1, 5 * HISTORY_LIMIT + 1):
        race.validation_end(step=step, value=step / (5 * HISTORY_LIMIT))
    history = race.figures(1)["target_history"]
    steps = [entry["step"] for entry in history]
    assert HISTORY_LIMIT // 2 <= len(history) <= HISTORY_LIMIT
    assert steps[0] == 1 and steps[-1] == 5 * HISTORY_LIMIT and steps == sorted(steps)
    figures = race.figures(1)  # the crossing and the best are exact, whatever was thinned
    assert figures["steps_to_target"] == 5 * HISTORY_LIMIT // 2 and figures["target"]["best"] == 1.0


@pytest.mark.parametrize(
    ("logged", "target", "mode"),
    [
        (342 / 360, 0.95, "max"),  # digits: 95.0 % logged as the float32 0.949999988
        (324 / 360, 0.9, "max"),  # 90.0 %
        (0.1, 0.1, "min"),  # a loss exactly on its target
        (1 / 3, 1 / 3, "min"),
    ],
)
def test_a_metric_exactly_on_the_target_reaches_it(logged, target, mode):
    value = torch.tensor(logged, dtype=torch.float32).item()  # what Lightning's metric holds
    assert value != target  # the float32 value differs from the float64 target...
    race = Race("val/acc" if mode == "max" else "val/loss", target, mode, clock=lambda: 0.0)
    assert race.validation_end(step=10, value=value) is True  # ...but it is on the target
    assert race.figures(1)["steps_to_target"] == 10
    below = torch.tensor(logged - 1 / 360 if mode == "max" else logged + 1e-3).item()
    assert Race("m", target, mode, clock=lambda: 0.0).validation_end(10, below) is False
