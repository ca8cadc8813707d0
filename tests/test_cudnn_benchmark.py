"""cudnn_benchmark: the flag is on during fit, and put back after it, also when training fails."""

from __future__ import annotations

import pytest
import torch

from tuneup import TuneupError, hookimpl
from tuneup.trainer import runner


class FlagSpy:
    def __init__(self, fail: bool = False) -> None:
        self.during: list[bool] = []
        self.fail = fail

    @hookimpl
    def on_train_batch_start(self):
        self.during.append(torch.backends.cudnn.benchmark)
        if self.fail:
            raise TuneupError("stop here")


@pytest.fixture
def spy(add_plugin, monkeypatch):
    """``spy(**kwargs)``: runs started in this test also register a :class:`FlagSpy`."""
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)  # and restored after the test
    return lambda **kwargs: add_plugin(FlagSpy(**kwargs))


def test_flag_is_on_during_training_and_restored_after(train, spy):
    flags = spy()
    summary, _ = train("cudnn_benchmark=on", "trainer.max_steps=2", "trainer.accelerator=cpu")
    assert flags.during == [True, True]
    assert torch.backends.cudnn.benchmark is False
    assert summary["plugins"]["cudnn_benchmark"] == {
        "name": "on",
        "effect": "none on cpu: cuDNN runs on CUDA only",
    }


def test_flag_is_restored_when_training_fails(train, spy):
    flags = spy(fail=True)
    with pytest.raises(TuneupError, match="stop here"):
        train("cudnn_benchmark=on")
    assert flags.during == [True] and torch.backends.cudnn.benchmark is False


def test_off_leaves_the_flag_alone(train, spy):
    flags = spy()
    train("trainer.max_steps=1")
    assert flags.during == [False]


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        (
            "+trainer.deterministic=true",
            "cudnn_benchmark=on conflicts with trainer.deterministic=True",
        ),
        (
            "+trainer.deterministic=warn",
            "cudnn_benchmark=on conflicts with trainer.deterministic=warn",
        ),
        ("+trainer.benchmark=false", "cudnn_benchmark=on conflicts with trainer.benchmark=False"),
    ],
)
def test_conflicting_trainer_settings_are_check_errors(tmp_path, override, expected):
    from tests.conftest import compose_config

    with pytest.raises(runner.ConfigError) as error:
        runner.run(compose_config(["cudnn_benchmark=on", override]), run_dir=tmp_path)
    assert f"[cudnn_benchmark] {expected}" in str(error.value)
