"""A command composes its config once, not twice (tuneup/mode_probe.py), and a config that sets
``hydra.mode`` is still obeyed: the probe Hydra composes for runs wherever its answer is not
known."""

from __future__ import annotations

import sys
import textwrap

import pytest
import yaml
from hydra._internal.hydra import Hydra
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode

from tests.conftest import CONF
from tuneup import cli


@pytest.fixture
def command(monkeypatch, tmp_path):
    """``command(*args)``: ``tuneup ARGS`` in this process with a task that trains nothing;
    returns (compositions, the modes the jobs saw)."""

    def run(*args):
        composed, modes = [], []
        compose = Hydra.compose_config

        def counted(self, *a, **kw):
            composed.append(kw.get("run_mode"))
            return compose(self, *a, **kw)

        def task(cfg):
            modes.append(HydraConfig.get().mode)
            raise SystemExit(0)  # trained nothing, in a run or a sweep's first job

        monkeypatch.setattr(Hydra, "compose_config", counted)
        monkeypatch.setattr(cli, "task", task)
        monkeypatch.chdir(tmp_path)
        monkeypatch.setattr(
            sys,
            "argv",
            [
                "tuneup",
                f"hydra.run.dir={tmp_path / 'run'}",
                f"hydra.sweep.dir={tmp_path / 'sweep'}",
                *args,
            ],
        )
        with pytest.raises(SystemExit) as done:
            cli.main()
        assert done.value.code == 0
        return composed, modes

    return run


def test_a_run_composes_its_config_once(command):
    composed, modes = command("model=mlp")
    assert composed == [RunMode.RUN] and modes == [RunMode.RUN]  # before: the probe, then the run


def test_a_config_folder_that_sets_the_mode_still_makes_a_sweep_without_dash_m(command, tmp_path):
    """``hydra.mode: MULTIRUN`` in the user's own preset: the probe composes and finds it."""
    (tmp_path / "conf" / "experiment").mkdir(parents=True)
    (tmp_path / "conf" / "experiment" / "lr_sweep.yaml").write_text(
        textwrap.dedent("""\
        # @package _global_
        hydra:
          mode: MULTIRUN
        """)
    )
    composed, modes = command("experiment=lr_sweep", "optimizer.lr=0.1,0.01")
    assert composed[0] == RunMode.MULTIRUN  # the probe
    assert modes == [RunMode.MULTIRUN]


def test_a_stored_node_that_sets_the_mode_is_found(command):
    """A Hydra plugin's ConfigStore node (no folder of configs) setting the mode: probed too."""
    store = ConfigStore.instance()
    store.store(
        group="experiment",
        name="stored_sweep",
        package="_global_",
        node={"hydra": {"mode": "MULTIRUN"}},
    )
    try:
        composed, modes = command("experiment=stored_sweep", "optimizer.lr=0.1,0.01")
    finally:
        del store.repo["experiment"]["stored_sweep.yaml"]
    assert composed[0] == RunMode.MULTIRUN and modes == [RunMode.MULTIRUN]


def test_an_override_of_the_mode_is_obeyed(command):
    composed, modes = command("hydra.mode=MULTIRUN", "optimizer.lr=0.1,0.01")
    assert len(composed) == 2 and modes == [RunMode.MULTIRUN]


def test_no_built_in_config_sets_hydra_mode():
    """What lets a command skip the probe: no file of conf/ sets ``hydra.mode``, by the package
    it lands in (its ``# @package`` line, else its folder)."""
    setting = []
    for path in CONF.rglob("*.yaml"):
        text = path.read_text()
        group = path.parent.relative_to(CONF).as_posix().replace("/", ".")
        header = next(
            (
                line.split("@package", 1)[1].strip()
                for line in text.splitlines()
                if line.startswith("# @package")
            ),
            None,
        )
        # the primary config's folder is "." (the root): no package but its header's
        package = (header if header is not None else group).removeprefix("_global_").strip(".")
        node = yaml.safe_load(text) or {}
        for part in [p for p in package.split(".") if p]:
            node = {part: node}
        if isinstance(node, dict) and (node.get("hydra") or {}).get("mode") is not None:
            setting.append(str(path.relative_to(CONF)))
    assert setting == []
    assert len(list(CONF.rglob("*.yaml"))) > 50  # it read them
