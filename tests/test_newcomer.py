"""What a newcomer types first: typos, contradictions and missing pieces are refused with a line
that says what was meant, before anything is trained (issue 25)."""

from __future__ import annotations

import logging

import pytest
import torch

from tests.conftest import compose_config, run_cli
from tuneup import override_syntax
from tuneup.trainer.hints import choice_hints, override_hints
from tuneup.trainer.runner import ConfigError, run


def refused(tmp_path, *overrides) -> str:
    """The config error of a run with ``overrides``; nothing may have been trained."""
    with pytest.raises(ConfigError) as info:
        run(compose_config(overrides), run_dir=tmp_path / "run")
    assert not (tmp_path / "run" / "checkpoints").exists()
    return str(info.value)


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("+precison=bf16", "precison=bf16 is not allowed: precison is not a config group or "
         "setting, nothing would read it; did you mean precision=bf16?"),
        ("+trainer.max_step=3", "trainer.max_step is not a Lightning Trainer argument; did you "
         "mean trainer.max_steps?"),
        ("+plugins.lst=true", "plugins.lst is not a setting of plugins; its settings are: "
         "autoload, disable, list; did you mean plugins.list?"),
        ("+optimizer.lrr=0.1", "did you mean optimizer.lr?"),
        ("+foo.bar=1", "foo is not allowed: foo is not a config group or setting"),
        ("+precision.init_scal=1024", "precision.init_scal is not a setting of any precision "
         "option; their settings are: backoff_factor, emulate"),
        ("+precision.init_scal=1024", "did you mean precision.init_scale?"),
    ],
)  # fmt: skip
def test_a_key_nothing_reads_is_refused_with_what_was_meant(tmp_path, override, expected):
    assert expected in refused(tmp_path, override)


def test_a_top_level_key_used_by_an_interpolation_is_read(train):
    summary, _ = train("+my_width=4", "model.width=${my_width}", "trainer.max_steps=1")
    assert summary["status"] == "ok"


def test_hydras_could_not_override_says_what_was_meant(cli, tmp_path):
    result = cli("precison=bf16")
    assert result.returncode == 1
    # ours alone: Hydra's "Could not override" and its "use +precison" advice would contradict it
    assert result.stderr.strip() == (
        "error: did you mean precision=bf16? (precison is not a setting; +precison=bf16 would be "
        "refused: nothing reads it)"
    )
    assert not (tmp_path / "run").exists()
    # a misspelled option of a group: one line with its options and the one meant, not Hydra's
    # 12 to 16 lines with a search-path dump (issue 32 point 6.9)
    result = cli("precision=fp61", "model=resnet")
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "error: precision=fp61 is not an option of precision; its options are: amp, bf16, "
        "bf16-true, fp16, fp16-true, fp32, fp8, tf32; did you mean precision=fp16?",
        "error: model=resnet is not an option of model; its options are: custom, gpt, huggingface, lightning, "
        "mlp, resnet18, resnet34, resnet50, small_resnet; did you mean model=resnet50?",
    ]
    assert not (tmp_path / "run").exists()
    assert choice_hints(["-m", "precision=fp32,bf61"]) == [
        "precision=bf61 is not an option of precision; its options are: amp, bf16, bf16-true, "
        "fp16, fp16-true, fp32, fp8, tf32; did you mean precision=bf16?"
    ]
    # the same hint for the other keys, as the command computes it after Hydra's error
    assert override_hints(["trainer.max_step=3"])[0].startswith("did you mean trainer.max_steps=3?")
    assert override_hints(["-m", "optimizer.lrr=0.1,0.01"])[0].startswith(
        "did you mean optimizer.lr=0.1,0.01?"
    )
    assert override_hints(["trainer.gradient_clip_vall=1"])[0].startswith(
        "did you mean +trainer.gradient_clip_val=1?"  # a Lightning argument: with the +
    )


def test_disabling_a_plugin_the_config_switches_on_is_refused_naming_both(tmp_path):
    message = refused(tmp_path, "precision=fp16", "plugins.disable=[precision]")
    assert (
        "precision=fp16 switches plugin 'precision' on, but plugins.disable=[precision] "
        "leaves it out"
    ) in message


def test_disabling_an_installed_plugin_switched_on_by_config_is_refused(tmp_path, monkeypatch):
    package = tmp_path / "site" / "tuneup_probe"
    (package / "conf" / "probe").mkdir(parents=True)
    (package / "__init__.py").write_text("class Plugin:\n    pass\n")
    (package / "conf" / "probe" / "on.yaml").write_text("plugin: probe\nname: 'on'\n")
    (package / "conf" / "probe" / "off.yaml").write_text("name: 'off'\n")
    info = tmp_path / "site" / "tuneup_probe-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tuneup-probe\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[tuneup]\nprobe = tuneup_probe:Plugin\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    message = refused(tmp_path, "probe=on", "plugins.disable=[probe]")
    assert "probe=on switches plugin 'probe' on, but plugins.disable=[probe]" in message


@pytest.mark.parametrize("override", ["trainer.max_steps=0", "trainer.max_epochs=0"])
def test_a_run_that_would_train_nothing_is_refused(tmp_path, override):
    key = override.split("=")[0]
    assert f"{key}=0 is not allowed: expected an integer >= 1 or -1" in refused(tmp_path, override)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["model=custom"], "model._target_ is not set: your own model needs the dotted path"),
        (["model=lightning"], "model._target_ is not set"),
        (["data=custom"], "data._target_ is not set: your own data needs the dotted path"),
    ],
)
def test_own_model_or_data_without_target_names_the_key(tmp_path, overrides, expected):
    assert expected in refused(tmp_path, *overrides)


@pytest.mark.skipif(torch.cuda.is_available(), reason="about float16 on a CPU")
def test_fp16_on_a_cpu_warns_at_start_and_names_faster_choices(train, caplog):
    caplog.set_level(logging.WARNING)
    summary, _ = train("precision=fp16", "trainer.max_steps=1", "data.image_size=8")
    (warning,) = [r.getMessage() for r in caplog.records if "no fast CPU kernels" in r.getMessage()]
    assert warning.startswith("precision: precision=fp16 on cpu: float16 has no fast CPU kernels")
    assert "precision=fp32" in warning and "precision=amp" in warning
    assert summary["status"] == "ok"


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        # a group's name mistyped: model, not mode (a value, which has no .hidden), and the
        # option that has hidden, where the chosen one (small_resnet) has none (issue 43 point 14)
        (["modle.hidden=[32]"], "did you mean model=mlp model.hidden=[32]? (modle is not a config "
         "group or setting)"),
        (["model=mlp", "modle.hidden=[32]"], "did you mean model.hidden=[32]? (modle is not a "
         "config group or setting)"),
        (["-m", "modle.hidden=[32],[64]"], "did you mean model=mlp model.hidden=[32],[64]? "
         "(modle is not a config group or setting)"),
        (["model.hiden=[3]"], "did you mean model=mlp model.hidden=[3]? (model=small_resnet has no "
         "hiden)"),
        (["model.foo=1"], "model.foo is not a setting of model=small_resnet; its settings are: "
         "blocks, width"),
        (["model=mlp", "model.width=8"], "model.width is not a setting of model=mlp (its settings "
         "are: hidden); it is one of model=gpt, model=resnet18, model=resnet34, model=resnet50, "
         "model=small_resnet"),
        (["precison=bf16"], "did you mean precision=bf16? (precison is not a setting; "
         "+precison=bf16 would be refused: nothing reads it)"),
        (["ema=on", "+ema.decay=0.9"], "ema.decay is a setting already: give it without the +, "
         "ema.decay=0.9"),
        (["ema=off", "+ema.decay=0.9"], "ema.decay is a setting already: give it without the +, "
         "ema.decay=0.9; but with ema=off nothing reads it: switch the plugin on with ema=on"),
    ],
)  # fmt: skip
def test_a_mistyped_key_gets_the_key_meant(argv, expected):
    assert override_hints(argv) == [expected]


def test_a_mistyped_option_gets_the_option_meant():
    assert choice_hints(["weight_decay=skip_norm"]) == [
        "weight_decay=skip_norm is not an option of weight_decay; its options are: all, "
        "skip_norms_biases; did you mean weight_decay=skip_norms_biases?"
    ]


def test_a_node_mistyped_with_a_plus_gets_the_node_meant(tmp_path):
    assert refused(tmp_path, "+modle.hidden=[32]").endswith(
        "modle is not allowed: modle is not a config group or setting, nothing would read it; "
        "did you mean model.hidden=[32]?"
    )
    assert (
        "model.hidden is not a setting of model=small_resnet; its settings are: blocks, width; "
        "it is a setting of model=mlp" in refused(tmp_path, "+model.hidden=[32]")
    )


def test_a_mistyped_group_is_one_line_on_the_command_line(cli, tmp_path):
    result = cli("modle.hidden=[32]")
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "error: did you mean model=mlp model.hidden=[32]? (modle is not a config group or setting)"
    )


# -- an override that does not parse (issue 47 point 12) -----------------------------------------

RESUME_TAKES = "resume takes one checkpoint: a .ckpt path, auto or null"


def test_two_checkpoint_paths_are_one_line_saying_what_resume_takes(cli, tmp_path):
    """Hydra printed its parser's exception and a link to its grammar."""
    result = cli("resume=a.ckpt", "b.ckpt")
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"error: 'b.ckpt' after resume=a.ckpt is not an override: give key=value; {RESUME_TAKES} "
        """(a path with spaces in quotes: 'resume="a b.ckpt"')"""
    )
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["resume=a.ckpt;b.ckpt"], "resume=a.ckpt;b.ckpt does not parse: ';' (character 14) is "
         """not allowed in an unquoted value; quote the value: 'resume="a.ckpt;b.ckpt"'; """
         f"{RESUME_TAKES}"),
        (["resume=a.ckpt,b.ckpt"], f"resume=a.ckpt,b.ckpt: {RESUME_TAKES}, not a list; quote "
         """the value: 'resume="a.ckpt,b.ckpt"'"""),
        (["resume=[a.ckpt,b.ckpt]"], f"resume=[a.ckpt,b.ckpt]: {RESUME_TAKES}, not a list; "
         """quote the value: 'resume="[a.ckpt,b.ckpt]"'"""),
        (["model=mlp", "model.hidden=(8"], "model.hidden=(8 does not parse: extraneous input "
         """'('; quote the value: 'model.hidden="(8"'"""),
        (["-m", "resume=a.ckpt,b.ckpt"], None),  # a sweep over them: Hydra's to run
        (["resume=a.ckpt", 'hydra.run.dir="out #1"'], None),
    ],
)  # fmt: skip
def test_an_override_that_does_not_parse_is_one_line_naming_it(argv, expected):
    assert override_syntax.problem(argv) == expected


# -- the autotune and a user's own preset (issue 43 point 15) -----------------------------------

MINE = "# @package _global_\ndefaults:\n  - override /model: mlp\noptimizer:\n  lr: 0.05\n"


def test_two_presets_given_apart_are_refused_naming_the_list_that_combines_them(tmp_path):
    (tmp_path / "conf" / "experiment").mkdir(parents=True)
    (tmp_path / "conf" / "experiment" / "mine.yaml").write_text(MINE)
    result = run_cli("-m", "experiment=mine", "experiment=autotune", cwd=tmp_path, tiny=False)
    assert result.returncode == 1  # not the default small_resnet autotuned, exit 0
    assert result.stderr.strip() == (
        "error: experiment is given 2 times (experiment=mine experiment=autotune): Hydra would "
        "use the last one alone; presets combine as one list, experiment=[mine,autotune] (a "
        "later one's values win)"
    )
    assert not (tmp_path / "multirun").exists()
    # the list composes both: the user's model and lr, the autotune's sweeper and settings
    cfg = compose_config(["experiment=[mine,autotune]"], tiny=False, config_dir=tmp_path / "conf")
    assert cfg.model.name == "mlp" and cfg.optimizer.lr == 0.05 and "autotune" in cfg


def test_the_recipe_of_an_autotuned_preset_builds_on_that_preset(tmp_path):
    from tuneup.autotune.report.recipe import recipe_overrides, write_recipe
    from tuneup.trainer.config import compose

    command = ["experiment=[mine,autotune]", "optimizer.lr=0.1", "autotune.budget_minutes=1"]
    overrides = recipe_overrides(command, ("precision=bf16",))
    assert overrides == ["experiment=[mine]", "optimizer.lr=0.1", "precision=bf16"]
    sweep = tmp_path / "sweep"
    write_recipe(sweep, overrides, lambda key: key in ("precision", "model"), header=[])
    (sweep / "conf" / "experiment" / "mine.yaml").write_text(MINE)  # as the user's ./conf has it
    cfg = compose(["experiment=recipe"], config_dir=sweep / "conf")
    assert cfg.model.name == "mlp"  # the preset's
    assert cfg.optimizer.lr == 0.1 and cfg.precision.name == "bf16"  # the command's, the found


def test_the_autotunes_own_error_is_shown_not_a_hint_about_valid_keys(tmp_path):
    own = [
        "-m",
        "experiment=autotune",
        "model=custom",
        "model._target_=mynet.Net",
        "data=custom",
        "data._target_=mynet.data",
    ]
    result = run_cli(*own, "autotune.objective=time_to_targt", cwd=tmp_path, tiny=False)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "error: autotune settings: autotune.objective='time_to_targt' is not allowed: expected "
        "throughput | time_to_target"
    ]
    result = run_cli(*own, "autotune.objective=time_to_target", cwd=tmp_path, tiny=False)
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1] == (
        "error: autotune.objective=time_to_target needs a target: add e.g. target.metric=val/acc "
        "target.value=0.9 (and target.check_every_n_steps=...)"
    )
    assert "did you mean" not in result.stderr
