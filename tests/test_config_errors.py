"""Bad input stops the run before anything is built, naming the key and what is allowed."""

import json

import pytest
from omegaconf import OmegaConf

from tests.conftest import TINY, compose_config, run_cli
from tuneup.trainer.checks import inert_problems
from tuneup.trainer.config import BUILTIN_DIR as BUILTIN
from tuneup.trainer.runner import ConfigError, run


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["+optimizer.lrr=0.1"], "optimizer.lrr is not a setting of optimizer=sgd; its settings "
         "are: clip_grad_norm, lr, momentum, nesterov, weight_decay"),
        (["+model.widht=4"], "model.widht is not a setting of model=small_resnet; its settings "
         "are: blocks, width"),
        (["+scheduler.warmup=5"], "scheduler.warmup is not a setting of scheduler=cosine"),
        (["+data.shuffle=false"], "data.shuffle is not a setting of data=synthetic_images"),
        (["optimizer.momentum=0.0"], "optimizer.momentum=0.0 with optimizer.nesterov=true: "
         "Nesterov momentum needs momentum > 0"),
        (["trainer.max_epochs=-1"], "trainer.max_epochs=-1 and trainer.max_steps=-1: the run "
         "has no end, but scheduler=cosine needs the number of steps"),
    ],
)  # fmt: skip
def test_a_bad_key_or_value_is_named(make_config, tmp_path, overrides, expected):
    with pytest.raises(ConfigError) as info:
        run(make_config(overrides), run_dir=tmp_path)
    assert expected in str(info.value)
    assert not (tmp_path / "checkpoints").exists()  # nothing was built or trained


def test_endless_training_with_a_constant_schedule_runs(train):
    summary, _ = train("trainer.max_epochs=-1", "trainer.max_steps=3", "scheduler=constant")
    assert summary["status"] == "ok" and summary["steps"] == 3


# -- a setting of a plugin that is off (issue 43 point 13) --------------------------------------


def _switching_on(group):
    """The built-in options of ``group`` that switch its plugin on, and each one's settings."""
    from tuneup.trainer.config import builtin_dir
    from tuneup.trainer.off_options import _option_node

    found = {}
    for path in sorted((builtin_dir() / group).glob("*.yaml")):
        node = OmegaConf.to_container(_option_node(path, group))
        if "plugin" in node:
            found[path.stem] = {k: v for k, v in node.items() if k not in ("plugin", "name")}
    return found


OFF_GROUPS = sorted(p.parent.name for p in BUILTIN.glob("*/off.yaml"))


def test_every_group_with_an_off_option_is_in_the_table():
    assert {
        "activation_checkpointing",
        "augment",
        "checkpoint",
        "compile",
        "ema",
        "label_smoothing",
        "profiler",
        "progressive_resize",
        "tta",
    } <= set(OFF_GROUPS)


@pytest.mark.parametrize("group", OFF_GROUPS)
def test_the_off_option_takes_the_settings_of_the_options_that_switch_it_on(group):
    """Each off option carries every setting of its group's other options, so that Hydra takes
    ``-m ema=off,on ema.decay=0.9``; with the same values, so that a run that gives none of them
    is not told it did (tuneup.trainer.off_options.inert_settings)."""
    from tuneup.trainer.off_options import off_defaults, options_switching_on

    on = _switching_on(group)
    assert on and sorted(on) == options_switching_on(group)
    off = off_defaults(group)
    assert "plugin" not in off  # the plugin stays out
    for option, settings in on.items():
        assert set(settings) <= set(off), (
            f"{group}=off lacks {set(settings) - set(off)} of {option}"
        )
    assert any({k: off[k] for k in s} == s for s in on.values())  # one option's defaults


def test_an_option_file_is_parsed_once_while_unchanged_and_read_again_when_edited(tmp_path):
    """Each run's checks read every off option (inert_settings): parsed once, shared read-only,
    and an edited file is read as it is now."""
    from omegaconf import ReadonlyConfigError

    from tuneup.trainer.off_options import _option_node

    off = tmp_path / "off.yaml"
    off.write_text("name: off\ndecay: 0.9\n")
    first = _option_node(off, "ema")
    assert _option_node(off, "ema") is first  # not parsed again
    with pytest.raises(ReadonlyConfigError):
        first.decay = 0.5  # shared: no caller may change it for the others
    off.write_text("name: off\ndecay: 0.99\n")
    assert _option_node(off, "ema").decay == 0.99


def test_the_top_level_keys_of_config_files_are_read_once_while_unchanged(tmp_path, monkeypatch):
    """The checks of every trial a study composes ask which top-level keys the config files
    give (a primary config's, a group's name, a preset's): each file parsed once while it is
    unchanged, an edited or a new file read as it is now."""
    from tuneup.trainer import config

    (tmp_path / "config.yaml").write_text("defaults: [_self_]\nwidth: 4\n")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "small.yaml").write_text("depth: 2\n")
    preset = tmp_path / "experiment" / "fast.yaml"
    preset.parent.mkdir()
    preset.write_text("# @package _global_\nmy_width: 8\n")
    assert config.top_level_keys([tmp_path]) == {"width", "model", "my_width"}
    loads = []
    monkeypatch.setattr(config.OmegaConf, "load", lambda p: loads.append(p) or {})
    assert config.top_level_keys([tmp_path]) == {"width", "model", "my_width"}
    assert loads == []  # nothing parsed again
    monkeypatch.undo()
    preset.write_text("# @package _global_\nmy_width: 8\nmy_depth: 3\n")
    (tmp_path / "extra.yaml").write_text("other: 1\n")
    found = config.top_level_keys([tmp_path])
    assert found == {"width", "model", "my_width", "my_depth", "other"}  # a preset: its keys


def test_a_setting_of_each_off_plugin_is_named_on_the_command_line_and_kept_from_a_file():
    """Composed with each off option and one of its settings given, as a sweep's job with the
    plugins off is (one composition for all the groups: each costs about a second): accepted,
    and a single run's check names each setting (a value nothing reads); the same settings
    from a config file are kept for when the plugin is on."""
    from tuneup.trainer.off_options import off_defaults

    given, expected = [], {}
    for group in OFF_GROUPS:
        if not any(_switching_on(group).values()):
            continue  # a plugin without settings (cudnn_benchmark=on, tta=flip)
        off = off_defaults(group)
        key, value = next((k, v) for k, v in off.items() if k != "name")
        other = [1] if isinstance(value, list) else (not value if isinstance(value, bool) else 7)
        given += [f"{group}=off", f"{group}.{key}={other}"]
        expected[group] = f"{group}.{key}={other} does nothing: {group}=off"
    assert len(expected) >= 6
    cfg = compose_config(given)
    problems = inert_problems(cfg, given)
    assert len(problems) == len(expected), problems
    for group, start in expected.items():
        assert any(p.startswith(start) for p in problems), (group, problems)
    offs = given[::2]
    assert inert_problems(cfg, offs) == []  # from a config file: kept for when it is on
    assert inert_problems(compose_config(offs), offs) == []


def test_a_setting_of_a_plugin_that_is_off_is_refused_in_a_single_run(tmp_path):
    for overrides in (["ema=off", "ema.decay=0.9"], ["ema=off", "++ema.decay=0.9"]):
        (problem,) = inert_problems(compose_config(overrides), overrides)
        assert problem.startswith(
            "ema.decay=0.9 does nothing: ema=off leaves the plugin out, "
            "nothing reads its settings; switch it on with ema=on"
        )
    result = run_cli("ema=off", "ema.decay=0.9", f"hydra.run.dir={tmp_path}")
    assert result.returncode == 1
    assert "ema.decay=0.9 does nothing: ema=off leaves the plugin out" in result.stderr
    assert not (tmp_path / "checkpoints").exists()
    # a preset's setting for when the plugin is on (docs/your_own_model.md) trains
    run(compose_config(["ema=off", "ema.decay=0.9"]), run_dir=tmp_path / "in")
    assert json.loads((tmp_path / "in" / "summary.json").read_text())["status"] == "ok"


def test_a_sweep_switches_a_plugin_off_and_on_with_its_setting(tmp_path):
    sweep = tmp_path / "sweep"
    result = run_cli(
        "-m",
        "ema=off,on",
        "ema.decay=0.9",
        f"hydra.sweep.dir={sweep}",
        *TINY,
        "data.image_size=8",
        "trainer.max_steps=2",
        "checkpoint=off",
        "trainer.enable_progress_bar=false",
        tiny=False,
    )
    assert result.returncode == 0, result.stderr
    off, on = (json.loads((sweep / str(n) / "summary.json").read_text()) for n in (0, 1))
    assert off["status"] == on["status"] == "ok"
    assert "ema" not in off["plugins"]  # inert where the plugin is off
    assert on["plugins"]["ema"]["decay"] == 0.9  # read where it is on


def test_a_resumed_run_does_not_list_an_off_plugins_unread_settings_as_changes():
    from tuneup.trainer.state.changes import differences, snapshot

    off, on = (snapshot(compose_config([f"ema={c}", "checkpoint=off"])) for c in ("off", "on"))
    assert off["ema.name"] == "off" and "ema.decay" not in off  # as a checkpoint records it
    assert "checkpoint.keep_last" not in off
    changed = [key for key, _, _ in differences(off, on) if key.startswith("ema.")]
    assert changed == [
        "ema.decay",
        "ema.every_n_steps",
        "ema.name",
        "ema.plugin",
        "ema.validate_with",
        "ema.warmup",
    ]
