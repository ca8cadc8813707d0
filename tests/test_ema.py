"""ema=on: the moving average of the weights is what validation runs on, it resumes bit for bit
after a kill -9, it is the same under DDP x2 and FSDP2 x2 (sharded, through DCP) as in one
process, and tuneup-consolidate --ema writes it.

Runs: the in-process references (small_resnet with BatchNorm; an mlp; a GPT), one single-process
run killed and resumed, one DDP x2 run, one FSDP x2 run killed and resumed.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import torch

import tuneup
from tests.conftest import compose_config, register_in_runs, run_cli, tiny_gpt
from tests.plugin_dists import make_distribution
from tests.test_resume import CRASH
from tuneup import hookimpl
from tuneup.consolidate import consolidate
from tuneup.consolidate import main as consolidate_main
from tuneup.plugins.ema import settings_problems
from tuneup.trainer.components import Plan
from tuneup.trainer.state import sharded
from tuneup.trainer.state.checkpoint_read import load
from tuneup.trainer.state.checkpoints import list_checkpoints

EMA = [
    "ema=on",
    "ema.decay=0.8",
    "ema.every_n_steps=2",
    "trainer.accelerator=cpu",
    "trainer.enable_progress_bar=false",
    "checkpoint.every_n_steps=1",
]
#: 8 steps (256 samples, a global batch of 32).
MLP = [
    "model=mlp",
    "model.hidden=[32]",
    "data.train_samples=256",
    "data.val_samples=64",
    "data.batch_size=32",
    "trainer.max_epochs=1",
    *EMA,
]
#: 2 epochs of 2 steps (32 samples, a global batch of 16), as tests/test_model_parallel.py.
GPT = [*tiny_gpt(epochs=2), *EMA, "ema.every_n_steps=1"]
ONE_THREAD = {"OMP_NUM_THREADS": "1"}


class Probe:
    """What the model holds while validation runs (after ema swapped its weights in)."""

    def __init__(self) -> None:
        self.validated: list[dict] = []
        self.metrics: list[dict] = []

    @hookimpl(trylast=True)
    def on_validation_start(self, module):
        self.validated.append({k: v.detach().clone() for k, v in module.state_dict().items()})

    @hookimpl(tryfirst=True)
    def on_validation_end(self, trainer):
        self.metrics.append({k: float(v) for k, v in trainer.callback_metrics.items()})


def train_in_process(run_dir: Path, overrides, probe=None) -> dict:
    """One run in this process on one thread (as the subprocesses run), with ``probe``."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with pytest.MonkeyPatch.context() as patch:
            register_in_runs(patch, [] if probe is None else [probe])
            tuneup.run(compose_config(overrides, tiny=False), run_dir=run_dir)
    finally:
        torch.set_num_threads(threads)
    return json.loads((run_dir / "summary.json").read_text())


def newest(run_dir: Path) -> Path:
    return list_checkpoints(run_dir / "checkpoints")[0]


def ema_of(path: Path) -> dict[str, torch.Tensor]:
    return load(path)["tuneup"]["ema"]["model_shaped"]


def relative_difference(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].float() - b[k].float()).norm() / b[k].float().norm()) for k in b)


@pytest.fixture(scope="module")
def crash_site(tmp_path_factory):
    site = tmp_path_factory.mktemp("site")
    make_distribution(
        site, "tuneup-crash", {"tuneup_crash": CRASH}, {"crash": "tuneup_crash:Plugin"}
    )
    return site


def train_cli(run_dir: Path, *args, site=None, crash: dict | None = None, ok: bool = True):
    env = {**ONE_THREAD, **(crash or {}), **({"PYTHONPATH": str(site)} if site else {})}
    result = run_cli(f"hydra.run.dir={run_dir}", *args, tiny=False, env=env)
    if ok:
        assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.fixture(scope="module")
def mlp_reference(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("mlp-reference")
    train_in_process(run_dir, MLP)
    return run_dir


# -- one process: the EMA is what is validated ------------------------------------------------


def test_validation_runs_on_the_ema_weights_batchnorm_statistics_included(tmp_path):
    probe = Probe()
    overrides = [
        "model=small_resnet",
        "model.width=8",
        "data.train_samples=256",
        "data.val_samples=64",
        "data.batch_size=32",
        "trainer.max_epochs=1",
        "data.preprocess=worker",
        *EMA,
    ]
    # data.preprocess=worker: the loader gives floats, evaluated by hand below
    summary = train_in_process(tmp_path, overrides, probe)
    assert summary["ema"]["updates"] == 4  # 8 steps, every 2nd
    checkpoint = load(newest(tmp_path))
    raw, ema = checkpoint["state_dict"], checkpoint["tuneup"]["ema"]["model_shaped"]
    assert "model.bn1.running_mean" in ema  # BatchNorm's statistics are averaged
    assert "model.bn1.num_batches_tracked" not in ema  # an integer: the raw one
    assert relative_difference(ema, {k: raw[k] for k in ema}) > 1e-2  # not the weights

    (validated,) = probe.validated
    for name, value in validated.items():  # what validation ran on: the EMA, not the weights
        assert torch.equal(value, ema.get(name, raw[name])), name

    # The logged metrics are those of the exported EMA weights, evaluated here by hand.
    out = tmp_path / "ema.pt"
    assert consolidate_main([str(newest(tmp_path)), str(out), "--ema"]) == 0
    plan = Plan(compose_config(overrides, tiny=False))
    model = plan.build_model()
    model.load_state_dict(torch.load(out))
    model.eval()
    data = plan.data
    data.setup("fit")
    with torch.no_grad():
        losses = [torch.nn.functional.cross_entropy(model(x), y) for x, y in data.val_dataloader()]
    assert probe.metrics[0]["val/loss"] == pytest.approx(float(torch.stack(losses).mean()), 1e-5)
    assert torch.equal(torch.load(out)["conv1.weight"], ema["model.conv1.weight"])


# -- kill -9, resume=auto: bit for bit --------------------------------------------------------


@pytest.mark.cold  # the killed run from a fresh interpreter, as a user's run is
def test_ema_resumes_bit_for_bit_after_kill_9(tmp_path, crash_site, mlp_reference):
    """Killed in micro-batch 6: resumed mid-epoch from step 5, between two EMA updates."""
    killed = train_cli(
        tmp_path, *MLP, site=crash_site, ok=False, crash={"CRASH_AT_MICRO_BATCH": "6"}
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert newest(tmp_path).name.endswith("step00000005.ckpt")
    train_in_process(tmp_path, [*MLP, "resume=auto"])  # as the user's command, one thread
    got, expected = ema_of(newest(tmp_path)), ema_of(newest(mlp_reference))
    assert got.keys() == expected.keys()
    for name, value in expected.items():
        assert torch.equal(got[name], value), f"{name} differs from the uninterrupted run"
    assert load(newest(tmp_path))["tuneup"]["ema"]["updates"] == 4


# -- DDP x2 and FSDP2 x2 -----------------------------------------------------------------------


def test_ddp_ema_equals_one_process_on_the_whole_batch(tmp_path, mlp_reference):
    train_cli(tmp_path, *MLP, "strategy=ddp", "trainer.devices=2", "data.batch_size=16")
    expected = ema_of(newest(mlp_reference))
    assert relative_difference(ema_of(newest(tmp_path)), expected) < 1e-5
    assert relative_difference(load(newest(mlp_reference))["state_dict"], expected) > 1e-3


def test_fsdp_sharded_ema_saves_resumes_and_consolidates_as_one_process(tmp_path, crash_site):
    """FSDP x2 killed in micro-batch 4 (epoch 2), resumed from step 3's sharded checkpoint:
    step 3 trained after a validation on the EMA weights."""
    reference = tmp_path / "one"
    train_in_process(reference, [*GPT, "data.batch_size=16"])
    run = tmp_path / "fsdp"
    fsdp = [*GPT, "strategy=fsdp", "trainer.devices=2", "data.batch_size=8"]
    killed = train_cli(run, *fsdp, site=crash_site, ok=False, crash={"CRASH_AT_MICRO_BATCH": "4"})
    assert killed.returncode in (-signal.SIGKILL, 1, 137), killed.stderr[-3000:]
    saved = newest(run)
    assert saved.is_dir() and saved.name.endswith("step00000003.ckpt")
    meta = load(saved / sharded.META, verify_checksum=False)
    assert meta["tuneup"]["ema"]["model_shaped"] == sharded.IN_SHARDS  # the shards hold it

    train_cli(run, *fsdp, "resume=auto")
    ema = consolidate(newest(run), tmp_path / "ema.pt", ema=True)
    expected = consolidate(newest(reference), tmp_path / "one.pt", ema=True)
    assert relative_difference(ema, expected) < 1e-5
    assert relative_difference(consolidate(newest(run), tmp_path / "raw.pt"), expected) > 1e-3


def test_bad_settings_are_one_line_problems():
    cfg = compose_config(
        [
            "ema=on",
            "ema.decay=1",
            "ema.every_n_steps=0",
            "ema.validate_with=x",
            "+ema.decy=0.9",
            "strategy=fsdp",
            "strategy.checkpoint=full",
        ]
    )
    found = settings_problems(cfg)
    assert found[1:4] == [
        "ema.decay=1 is not allowed: expected a number > 0 and < 1",
        "ema.every_n_steps=0 is not allowed: expected an integer >= 1",
        "ema.validate_with='x' is not allowed: expected one of 'ema', 'raw'",
    ]
    assert (
        found[0] == "ema.decy is not an ema setting; allowed: decay, every_n_steps, warmup, "
        "validate_with"
    )
    assert "use strategy.checkpoint=sharded" in found[4] and len(found) == 5
    assert settings_problems(compose_config(["ema=on"])) == []
    (found,) = settings_problems(compose_config(["ema=on", "mode=validate"]))
    assert found.startswith("ema=on with mode=validate")
