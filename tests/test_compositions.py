"""The tests' compositions (tests/compositions.py: each set of config groups composed once, the
values applied by Hydra) are Hydra's whole compositions: the same config, flags and errors,
for the built-in groups, an installed plugin's and the project's own ./conf."""

from __future__ import annotations

import pytest
from hydra.errors import HydraException
from omegaconf import OmegaConf

import tuneup
from tests import compositions
from tests.plugin_dists import make_distribution

#: Override lists on two sets of groups (values only, model=gpt + data) and Hydra's kinds of
#: value override: set, add (+), force-add (++), delete (~), a list, a dict, an interpolation.
CASES = [
    ["model.width=8", "data.batch_size=32"],
    ["data.batch_size=16", "+trainer.gradient_clip_val=1.0", "~trainer.num_sanity_val_steps"],
    ["model=gpt", "data=synthetic_tokens", "model.layers=2", "++seed=3", "+my_width=4"],
    ["model.width=${my_width}", "+my_width=4", "model=gpt", "data=synthetic_tokens"],
    ["plugins.disable=[ema]", "optimizer={name: sgd, lr: 0.5}", "precision=bf16"],
]


def same(kept, whole) -> None:
    assert OmegaConf.to_yaml(kept) == OmegaConf.to_yaml(whole)
    assert OmegaConf.is_struct(kept) and OmegaConf.is_struct(whole)


def test_kept_compositions_with_their_values_applied_are_hydras_whole_ones():
    for overrides in CASES:
        same(compositions.compose(overrides), tuneup.compose(overrides))
    kept = compositions.compose(CASES[0])
    kept.model.width = 99  # each call its own copy
    assert compositions.compose(CASES[0]).model.width == 8


def test_the_values_of_one_set_of_groups_share_its_composition(monkeypatch, tmp_path):
    """In any working directory without a ./conf."""
    monkeypatch.setattr(compositions, "_COMPOSERS", {})
    compositions.compose(["model.width=4"])
    monkeypatch.chdir(tmp_path)
    compositions.compose(["model.width=5", "data.batch_size=8"])
    (composer,) = compositions._COMPOSERS.values()
    assert list(composer.composed) == [()]  # the built-in groups' defaults, composed once


@pytest.mark.parametrize(
    "bad", ["data.batch_sizee=3", "+trainer.max_epochs=3", "~trainer.nothing", "model.width"]
)
def test_a_refused_override_is_hydras_error(bad):
    with pytest.raises(HydraException) as whole:
        tuneup.compose(["model.width=8", bad])
    with pytest.raises(HydraException) as kept:
        compositions.compose(["model.width=8", bad])
    assert (type(kept.value), str(kept.value)) == (type(whole.value), str(whole.value))


def test_an_installed_plugins_group_and_the_projects_own_are_groups(monkeypatch, tmp_path):
    site = tmp_path / "site"
    (site / "tuneup_probe" / "conf" / "probe").mkdir(parents=True)
    (site / "tuneup_probe" / "conf" / "probe" / "on.yaml").write_text("plugin: probe\n")
    (site / "tuneup_probe" / "conf" / "probe" / "off.yaml").write_text("name: 'off'\n")
    make_distribution(
        site,
        "tuneup-probe",
        {"tuneup_probe/__init__": "class Plugin:\n    pass\n"},
        {"probe": "tuneup_probe:Plugin"},
    )
    (tmp_path / "conf" / "experiment").mkdir(parents=True)
    (tmp_path / "conf" / "experiment" / "mine.yaml").write_text(
        "# @package _global_\ntrainer:\n  max_epochs: 7\n"
    )
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.chdir(tmp_path)
    overrides = ["probe=on", "experiment=mine", "model.width=8", "plugins.disable=[probe]"]
    kept = compositions.compose(overrides)
    same(kept, tuneup.compose(overrides))
    assert kept.probe.plugin == "probe" and kept.trainer.max_epochs == 7


def test_a_plugin_installed_into_a_folder_on_the_path_is_seen(monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(str(tmp_path))
    before = compositions.installed_plugins()
    make_distribution(
        tmp_path, "tuneup-late", {"late": "class Plugin:\n    pass\n"}, {"late": "late:Plugin"}
    )
    assert compositions.installed_plugins() == tuple(sorted([*before, "late=late:Plugin"]))
