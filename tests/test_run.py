"""`python run.py` as a user runs it: trains, validates, prints and writes the summary."""

import csv
import json

import pytest
import torch

from tests.conftest import compose_config
from tuneup.trainer.checks import TRAINER_RULES
from tuneup.trainer.runner import ConfigError, run
from tuneup.trainer.validation import problems

REQUIRED_KEYS = {
    "samples_per_s",
    "step_time_ms",
    "data_wait_fraction",
    "peak_memory_bytes",
    "device",
    "world_size",
    "steps",
    "epochs",
    "train_loss",
    "val",
    "plugins",
}


@pytest.mark.cold  # the Quickstart's run, from a fresh interpreter as a user starts it
def test_default_run_trains_to_twice_chance_and_writes_summary(cli, tmp_path):
    """The default run's first epoch (its whole three, 0.72 accuracy, are the Quickstart's
    first command, which .ci/run runs before the tests)."""
    result = cli("trainer.max_epochs=1", tiny=False)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary.keys() >= REQUIRED_KEYS
    assert summary["status"] == "ok"
    assert summary["val"]["acc"] >= 0.2  # 10 classes: twice chance
    assert summary["epochs"] == 1 and summary["steps"] == 4096 // 64
    assert "tuneup run summary" in result.stdout and "samples_per_s" in result.stdout
    assert (tmp_path / "run" / "metrics.csv").is_file()  # the default csv logger


def test_summary_figures_are_consistent(train):
    summary, _ = train("trainer.max_epochs=2", "trainer.accelerator=cpu")  # GPU: tests/gpu/
    assert summary["steps"] == 2 * 256 // 32 and summary["epochs"] == 2
    assert summary["world_size"] == 1 and summary["device"].startswith("cpu")
    assert summary["samples_per_s"] > 0
    times = summary["step_time_ms"]
    assert 0 < times["p50"] <= times["p90"]
    assert 0 <= summary["data_wait_fraction"] < 1
    assert summary["peak_memory_bytes"] > 10 * 2**20  # process RSS on CPU
    assert isinstance(summary["train_loss"], float)
    assert set(summary["val"]) == {"acc", "loss"}
    assert {"measure", "logger"} <= summary["plugins"].keys()
    assert summary["plugins"]["logger"] == {"name": "csv"}


#: Bad values given together in one command, each named with what is allowed on its own line
#: of the one error; and a group's unknown option, which Hydra refuses before them.
BAD_VALUES = {
    "data.batch_size=0": ["data.batch_size=0", "an integer >= 1"],
    "trainer.max_steps=abc": ["trainer.max_steps='abc'", "an integer >= 1 or -1"],
    "optimizer.lr=-1": ["optimizer.lr=-1", "a number > 0"],
    "trainer.accelerator=tpu": ["trainer.accelerator='tpu'", "'cpu'", "'gpu'"],
}


@pytest.mark.parametrize(
    "bad",
    [BAD_VALUES, {"model=nope": ["model=nope is not an option of model", "small_resnet", "mlp"]}],
    ids=["values", "group"],
)
def test_bad_value_exits_1_naming_key_value_and_allowed(cli, tmp_path, bad):
    result = cli(*bad)
    assert result.returncode == 1, result.stdout[-2000:]
    lines = result.stderr.splitlines()
    for override, expected in bad.items():
        assert any(all(text in line for text in expected) for line in lines), override
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()  # failed before training


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_gpu_requested_without_cuda_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match=r"trainer.accelerator=gpu but this machine has no CUDA"):
        run(compose_config(["trainer.accelerator=gpu"]), run_dir=tmp_path)


def test_trainer_deterministic_and_benchmark_take_lightnings_own_choices():
    """trainer.deterministic=warn (deterministic kernels where torch has them) and null are
    Lightning's; anything else is refused naming them."""
    cfg = compose_config(["+trainer.deterministic=warn", "+trainer.benchmark=null"])
    assert problems(cfg, TRAINER_RULES) == []
    cfg.trainer.deterministic, cfg.trainer.benchmark = "maybe", "warn"
    assert problems(cfg, TRAINER_RULES) == [
        "trainer.deterministic='maybe' is not allowed: expected one of True, False, 'warn', None",
        "trainer.benchmark='warn' is not allowed: expected one of True, False, None",
    ]


def test_all_problems_are_reported_together(tmp_path):
    cfg = compose_config(["data.batch_size=0", "seed=-3", "+trainer.no_such_arg=1"])
    with pytest.raises(ConfigError) as info:
        run(cfg, run_dir=tmp_path)
    message = str(info.value)
    assert "3 problem(s)" in message
    assert "data.batch_size=0" in message and "seed=-3" in message
    assert "trainer.no_such_arg is not a Lightning Trainer argument" in message
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "failed" and "problem" in summary["error"]


def test_training_does_not_synchronise_every_step(train, monkeypatch, tmp_path):
    """Tensor -> Python conversions are device syncs on GPU; none may happen per step. Nor
    does a step go through pluggy's dispatch (~5 us a call, five hooks a step: the bridge
    calls the per-step hooks' implementations directly), nor enter a profiler scope of
    tuneup's own (torch's optimizer, zero_grad and DataLoader scopes are the same in any loop).

    Counted over two runs that differ only in their number of steps, so the
    fixed costs (moving the model, validation, the final report) cancel out. The
    NaN/inf loss check takes its GPU path (deferred), as on a CUDA device.
    """
    import pluggy._manager
    import torch

    from tuneup.trainer.state import run_state

    monkeypatch.setattr(run_state, "defer_loss_check", lambda loss, trainer: True)

    hooks = {"n": 0}
    multicall = pluggy._manager._multicall

    def counting_multicall(*args, **kwargs):
        hooks["n"] += 1
        return multicall(*args, **kwargs)

    monkeypatch.setattr(pluggy._manager, "_multicall", counting_multicall)  # new managers use it
    scopes = {"n": 0}
    enter = torch.autograd.profiler.record_function.__enter__

    def counting_enter(self):
        scopes["n"] += 1
        return enter(self)

    monkeypatch.setattr(torch.autograd.profiler.record_function, "__enter__", counting_enter)

    calls = {"n": 0}
    for name in ("item", "__float__", "__int__", "__bool__", "tolist", "cpu", "numpy"):
        original = getattr(torch.Tensor, name)

        def counting(self, *args, _original=original, **kwargs):
            calls["n"] += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counting)

    def count(steps: int) -> tuple[int, int, int]:
        calls["n"] = hooks["n"] = scopes["n"] = 0
        summary, _ = train(
            f"data.train_samples={8 * steps}",
            "data.val_samples=8",
            "data.batch_size=8",
            "trainer.log_every_n_steps=1000",
            run_dir=tmp_path / str(steps),
        )
        assert summary["steps"] == steps
        return calls["n"], hooks["n"], scopes["n"]

    syncs, dispatches, entered = (a - b for a, b in zip(count(40), count(8), strict=True))
    assert syncs < 8, f"{syncs} host syncs for 32 more steps"
    assert dispatches < 8, f"{dispatches} pluggy hook calls for 32 more steps"
    assert entered <= 3 * 32, f"{entered} profiler scopes for 32 more steps (torch's: 3 a step)"


def test_a_run_stopped_mid_epoch_by_max_steps_is_validated_at_its_last_step(train):
    summary, run_dir = train("trainer.max_steps=5", "trainer.max_epochs=-1")  # 8 steps per epoch
    assert summary["steps"] == 5 and set(summary["val"]) == {"acc", "loss"}
    rows = [r for r in csv.DictReader((run_dir / "metrics.csv").open()) if r.get("val/acc")]
    assert [int(r["step"]) for r in rows] == [5]  # logged once, after the 5th step


def test_train_loss_is_the_real_loss_under_accumulation(train):
    summary, run_dir = train("grad_accum.steps=2")
    rows = [r for r in csv.DictReader((run_dir / "metrics.csv").open()) if r.get("train/loss")]
    assert summary["train_loss"] == pytest.approx(float(rows[-1]["train/loss"]), rel=1e-6)


def test_peak_memory_is_this_runs_not_the_processes(train):
    """In a sweep several runs share a process; an earlier peak must not leak into this run."""
    import resource

    import torch

    with open("/proc/self/statm") as f:  # the process's resident bytes now
        resident = int(f.read().split()[1]) * resource.getpagesize()
    before = torch.ones(2**28)  # 1 GiB touched, then freed: a peak of resident + 1 GiB
    del before
    summary, _ = train()
    assert summary["peak_memory_bytes"] < resident + 2**30
