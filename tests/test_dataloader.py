"""DataLoader plugin: worker processes and pinned memory through the configure_dataloader hook."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from tests.conftest import compose_config, register_in_runs
from tuneup import hookimpl
from tuneup.plugins.dataloader import auto_workers, loader_arguments
from tuneup.trainer import runner
from tuneup.trainer.environment import Environment


class LoaderSpy:
    """Records the DataLoader arguments the hook produced and the loader training really used."""

    def __init__(self) -> None:
        self.kwargs: list[dict] = []
        self.used = None

    @hookimpl(trylast=True)  # after the dataloader plugin
    def configure_dataloader(self, kwargs):
        self.kwargs.append({k: v for k, v in kwargs.items() if k != "dataset"})

    @hookimpl
    def on_train_batch_start(self, trainer):
        loader = trainer.train_dataloader
        self.used = (loader.num_workers, loader.pin_memory, loader.persistent_workers)


@pytest.fixture
def spy(monkeypatch):
    found = LoaderSpy()
    register_in_runs(monkeypatch, [found])
    return found


def test_workers_load_training_and_validation_batches(train, spy):
    summary, _ = train("dataloader=workers", "dataloader.num_workers=2", "trainer.accelerator=cpu")
    assert spy.used == (2, False, True)  # persistent by default; no pinning on CPU
    assert [k["drop_last"] for k in spy.kwargs] == [True, False]  # training, then validation
    assert all(k["num_workers"] == 2 for k in spy.kwargs)
    assert summary["plugins"]["dataloader"]["num_workers"] == 2
    assert 0 <= summary["data_wait_fraction"] < 1


def test_off_loads_in_the_training_process(train, spy):
    summary, _ = train()
    assert spy.used == (0, False, False) and "dataloader" not in summary["plugins"]


@pytest.mark.parametrize(
    ("processes", "cpus", "workers"), [(1, 2, 2), (1, 64, 8), (4, 16, 4), (8, 4, 0)]
)
def test_auto_shares_the_cpus_between_processes_up_to_8(processes, cpus, workers):
    assert auto_workers(processes, cpus=cpus) == workers


def env(accelerator="cpu", devices=1) -> Environment:
    return Environment(accelerator, devices, 1, accelerator, None, True)


def settings(**kwargs):
    base = {
        "num_workers": "auto",
        "pin_memory": "auto",
        "persistent_workers": None,
        "prefetch_factor": None,
    }
    return OmegaConf.create({**base, **kwargs})


def test_pin_memory_auto_pins_on_cuda_only():
    assert loader_arguments(settings(num_workers=2), env("cuda"))["pin_memory"] is True
    assert loader_arguments(settings(num_workers=2), env("cpu"))["pin_memory"] is False


def test_without_workers_no_worker_only_arguments_reach_torch():
    assert loader_arguments(settings(num_workers=0), env()) == {
        "num_workers": 0,
        "pin_memory": False,
    }
    with_workers = loader_arguments(settings(num_workers=3, prefetch_factor=4), env())
    assert with_workers["persistent_workers"] is True and with_workers["prefetch_factor"] == 4


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["dataloader.num_workers=0", "dataloader.persistent_workers=true"],
         "dataloader.persistent_workers=True needs worker processes, but dataloader.num_workers=0"),
        (["dataloader.num_workers=0", "dataloader.prefetch_factor=4"],
         "dataloader.prefetch_factor=4 is the batches each worker loads ahead, but "
         "dataloader.num_workers=0 starts no workers"),
        (["dataloader.num_workers=many"],
         "dataloader.num_workers='many' is not allowed: expected an integer >= 0 or 'auto'"),
    ],
)  # fmt: skip
def test_bad_settings_are_reported_before_anything_is_built(tmp_path, overrides, expected):
    with pytest.raises(runner.ConfigError, match="problem") as error:
        runner.run(compose_config(["dataloader=workers", *overrides]), run_dir=tmp_path)
    assert f"[dataloader] {expected}" in str(error.value)


def test_bad_setting_exits_1_on_the_command_line(cli):
    result = cli("dataloader=workers", "dataloader.num_workers=0", "dataloader.prefetch_factor=2")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert (
        "error: 1 problem(s)" in result.stderr and "set num_workers to 1 or more" in result.stderr
    )
