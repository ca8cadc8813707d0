"""Every optimizer's sharded checkpoint consolidates and resumes elsewhere, an empty state
included (issue 43 point 23: plain SGD keeps no per-parameter state; DCP writes no entry for
an empty dict, and reading the checkpoint back failed with ``KeyError: 'state'``).

The state-dict code is checked in this process for each optimizer (:data:`OPTIMIZERS`: a new
optimizer is one line): built as a run builds it, stepped, its state written as a sharded
checkpoint writes it (FSDP2's ``get_optimizer_state_dict`` by parameter name, DCP), read back
as ``tuneup-consolidate`` and a ``strategy=auto`` resume read it (:func:`full_checkpoint`),
loaded into a fresh optimizer that then steps as the first would. One real run, plain SGD
under ``strategy=fsdp`` (one process), goes through the command line's consolidation and a
resume on ``strategy=auto``.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from tests.conftest import compose_config
from tuneup.consolidate import main as consolidate_main
from tuneup.trainer.optim import build_optimizer
from tuneup.trainer.plugin_manager import PluginManager
from tuneup.trainer.state import sharded
from tuneup.trainer.state.checkpoints import list_checkpoints

#: Each optimizer a run can train with: its overrides. (A new optimizer: one line here.)
OPTIMIZERS = {
    "sgd": ["optimizer=sgd"],
    "sgd without momentum": ["optimizer=sgd", "optimizer.momentum=0.0", "optimizer.nesterov=false"],
    "adamw": ["optimizer=adamw"],
    "lamb": ["optimizer=lamb"],
    "lars": ["optimizer=lars"],
}


def net() -> nn.Module:
    torch.manual_seed(0)  # a norm and biases: a second parameter group under lamb and lars
    return nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 2))


def built(cfg, model: nn.Module) -> torch.optim.Optimizer:
    """The optimizer a run builds for ``model`` (trainer/module.py ``configure_optimizers``)."""
    plugins = PluginManager.from_config(cfg)
    params = plugins.pipeline(
        "configure_param_groups", "params", list(model.parameters()), cfg=cfg, model=model
    )
    trainer = SimpleNamespace(world_size=1, datamodule=None)
    made = plugins.call("configure_optimizer", cfg=cfg, params=params, trainer=trainer)
    return made if made is not None else build_optimizer(cfg, params)


def step(model: nn.Module, optimizer: torch.optim.Optimizer, seed: int) -> None:
    x = torch.randn(6, 4, generator=torch.Generator().manual_seed(seed))
    optimizer.zero_grad()
    model(x).square().mean().backward()
    optimizer.step()


def write_sharded(path, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """``model`` and ``optimizer`` as trainer/state/sharded.py ``save`` writes them (one
    process's shards), with the meta file and manifest of a finished save."""
    from lightning_fabric.strategies.model_parallel import _distributed_checkpoint_save
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    options = StateDictOptions(full_state_dict=False, cpu_offload=True)  # Lightning's, sharded
    by_name = get_optimizer_state_dict(model, optimizer, options=options)
    path.mkdir()
    _distributed_checkpoint_save({"state_dict": model.state_dict(), "optimizer_0": by_name}, path)
    torch.save({"global_step": 1}, path / sharded.META)
    sharded.write_manifest(path, {p.name: sharded.sha256(p) for p in path.iterdir()})


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_an_optimizer_s_sharded_state_is_read_back_whole_and_continues(name, tmp_path):
    cfg = compose_config(["model=mlp", *OPTIMIZERS[name]], tiny=False)
    model = net()
    optimizer = built(cfg, model)
    step(model, optimizer, seed=1)
    path = tmp_path / "epoch000-step00000001.ckpt"
    write_sharded(path, model, optimizer)

    whole = sharded.full_checkpoint(path)  # what tuneup-consolidate and strategy=auto read
    (state,) = whole["optimizer_states"]
    saved = optimizer.state_dict()
    assert sorted(state["state"]) == sorted(saved["state"])  # none at all for plain SGD
    resumed = net()
    resumed.load_state_dict(whole["state_dict"])
    again = built(cfg, resumed)
    again.load_state_dict(state)  # as Lightning restores it
    step(model, optimizer, seed=2)
    step(resumed, again, seed=2)
    for key, value in model.state_dict().items():
        assert torch.equal(resumed.state_dict()[key], value), f"{name}: {key} differs"


# -- one real run: plain SGD under strategy=fsdp ------------------------------------------------

RUN = [
    "model=mlp",
    "model.hidden=[8]",
    "data.image_size=8",
    "data.train_samples=32",
    "data.val_samples=8",
    "data.batch_size=8",
    "trainer.accelerator=cpu",
    "trainer.max_steps=2",
    "trainer.enable_progress_bar=false",
    "optimizer=sgd",
    "optimizer.momentum=0.0",
    "optimizer.nesterov=false",
]


def test_plain_sgd_under_fsdp_consolidates_and_resumes_on_one_process(train, tmp_path, capsys):
    _, run_dir = train(*RUN, "strategy=fsdp", "trainer.devices=1", tiny=False)
    newest = list_checkpoints(run_dir / "checkpoints")[0]
    assert newest.is_dir()  # sharded
    assert consolidate_main([str(newest), str(tmp_path / "weights.pt")]) == 0
    weights = torch.load(tmp_path / "weights.pt")
    assert set(weights) == {
        k.removeprefix("model.") for k in sharded.load_meta(newest)["state_dict"]
    }

    summary, _ = train(
        *RUN, "trainer.max_steps=3", "resume=auto", "strategy=auto", tiny=False, run_dir=run_dir
    )
    assert summary["status"] == "ok" and summary["steps"] == 3
    assert json.loads((run_dir / "summary.json").read_text())["resumed_from"].endswith(newest.name)
