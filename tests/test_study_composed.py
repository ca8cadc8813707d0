"""The study's checks compose each trial on a composition of its config groups
(tuneup/autotune/composed.py): the config is the one Hydra composes for the job, the
override lists Hydra records and its errors included. Hydra's own loader on the built-in
config folder, as the sweeper composes a job's config (load_sweep_config)."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from tuneup.autotune.composed import GroupComposer
from tuneup.autotune.race import race_settings

COMMAND = [
    "experiment=autotune",
    "autotune.objective=time_to_target",
    "data=digits",
    "model=mlp",
    "model.hidden=[64]",
    "target.metric=val/acc",
    "target.value=0.95",
]


@pytest.fixture(scope="module")
def sweep_load():
    """The sweeper's composition of a job's config: ``load(overrides)``, and whether a key
    is a config group (Hydra's repository)."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.utils import create_config_search_path
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.singleton import Singleton
    from hydra.types import RunMode

    before = Singleton.get_state()  # Hydra's config singleton, as the other tests find it
    loader = ConfigLoaderImpl(config_search_path=create_config_search_path("pkg://tuneup.conf"))
    master = loader.load_configuration(
        "config", ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2", *COMMAND], RunMode.MULTIRUN
    )
    HydraConfig.instance().set_config(master)
    yield (lambda overrides: loader.load_sweep_config(master, overrides)), loader.repository
    Singleton.set_state(before)


def test_a_trial_composed_on_its_groups_composition_is_the_jobs_config(sweep_load):
    load, repository = sweep_load
    base = [*COMMAND, *race_settings()]
    loads = []
    composer = GroupComposer(lambda o: loads.append(o) or load(o), base, repository.group_exists)
    trials = [
        ["optimizer=nadamw", "optimizer.lr=0.0095", "label_smoothing=on", "++ema.decay=0.9"],
        ["optimizer.lr=0.02", "optimizer=nadamw", "label_smoothing=on", "data.batch_size=256"],
        ["optimizer.lr=0.5", "trainer.max_epochs=3"],  # no group: your command's composition
    ]
    for trial in trials:
        got, want = composer(trial), load([*base, *trial])
        assert OmegaConf.to_container(got) == OmegaConf.to_container(want), trial
        assert list(got.hydra.overrides.task) == [*base, *trial]  # in their order
    assert got.optimizer.lr == 0.5 and got.trainer.max_epochs == 3
    # composed: the first trial's groups once (the second's values went on it), your command
    assert loads == [[*base, "optimizer=nadamw", "label_smoothing=on"], base]


def test_a_value_hydra_refuses_is_refused_with_hydras_words(sweep_load):
    load, repository = sweep_load
    base = [*COMMAND, *race_settings()]
    composer = GroupComposer(load, base, repository.group_exists)
    trial = ["optimizer=nadamw", "optimizer.no_such_key=1"]
    with pytest.raises(Exception) as want:
        load([*base, *trial])
    with pytest.raises(Exception) as got:
        composer(trial)
    assert str(got.value) == str(want.value)
    assert "Could not override 'optimizer.no_such_key'" in str(got.value)
