"""What a Lightning user expects and finds (issue 32 point 6.11): their callbacks from the config,
and a checkpoint evaluated without training (``mode=validate resume=CKPT``)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

import tuneup
from tests.conftest import compose_config
from tuneup.trainer.runner import ConfigError

STOP = (
    "+callbacks.stop={_target_: pytorch_lightning.callbacks.EarlyStopping, monitor: val/acc, "
    "mode: min, patience: 0}"
)  # stops once val acc fails to fall: after epoch 2
LR = "+callbacks.lr={_target_: pytorch_lightning.callbacks.LearningRateMonitor}"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("callbacks") / "run"
    tuneup.run(compose_config(["trainer.max_epochs=3", STOP, LR]), run_dir=out)
    return json.loads((out / "summary.json").read_text()), out


def test_callbacks_from_the_config_run_in_the_trainer(trained):
    summary, out = trained
    assert summary["status"] == "ok"
    assert summary["steps"] == 16 < 3 * 8  # EarlyStopping ended the run after 2 of 3 epochs
    with open(out / "metrics.csv") as f:
        assert "lr-SGD" in next(csv.reader(f))  # LearningRateMonitor's column


def test_mode_validate_evaluates_a_checkpoint_and_trains_nothing(trained, tmp_path):
    summary, out = trained
    newest = sorted((out / "checkpoints").glob("*.ckpt"))[-1]
    tuneup.run(compose_config(["mode=validate", f"resume={newest}"]), run_dir=tmp_path / "eval")
    evaluated = json.loads((tmp_path / "eval" / "summary.json").read_text())
    assert evaluated["status"] == "ok" and evaluated["steps"] == 0
    assert evaluated["val"] == summary["val"]  # the same weights on the same validation data
    assert not list((tmp_path / "eval").glob("checkpoints/*.ckpt"))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["+callbacks.x={_target_: no_such_pkg.Stop}"], "callbacks.x._target_"),
        (["+callbacks.x={_target_: torch.nn.Linear}"], "callbacks.x._target_=torch.nn.Linear "
         "is not allowed: expected a subclass of pytorch_lightning.Callback"),
        (["+callbacks.x=3"], "callbacks.x=3 is not allowed: expected a node with a _target_"),
        (["mode=validate"], "mode=validate needs resume=<checkpoint>"),
        (["mode=test"], "mode=test needs resume=<checkpoint>"),
        (["mode=tests"], "mode='tests' is not allowed: expected one of 'fit', 'validate', 'test', "
         "'predict'; did you mean mode=test?"),
    ],
)  # fmt: skip
def test_bad_callbacks_and_modes_are_one_line_before_anything_runs(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=None) as info:
        tuneup.run(compose_config(overrides), run_dir=tmp_path / "run")
    assert message in str(info.value)
    assert not Path(tmp_path / "run" / "checkpoints").exists()
