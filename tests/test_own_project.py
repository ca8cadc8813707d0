"""The user's own model, data and LightningModule, from a project outside the checkout, with the
installed ``tuneup`` command: the documented commands, every optimization plugin on them,
exact resume after a kill, and the checks that name both sides of a mismatch."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import torch

from tests.conftest import compose_config, python
from tests.own_project import (
    blocks,
    env,
    final_weights,
    summary,
    tuneup_command,
    write_project,
)
from tuneup.trainer.runner import ConfigError, run

#: fp16 autocast with loss scaling, channels_last, 2 micro-batches per step, checkpointed blocks.
LEVERS = [
    "precision=fp16",
    "memory_format=channels_last",
    "grad_accum.steps=2",
    "activation_checkpointing=blocks",
    "checkpoint.every_n_steps=1",
    "trainer.max_epochs=2",
]
#: (overrides, the micro-batch the kill comes at): 128 samples / 32 = 4 micro-batches, 2 steps
#: per epoch; killed in the 2nd epoch at micro-batch 7 (step 4's first), resumed from step 3's
#: checkpoint: mid-epoch, after an epoch boundary.
KINDS = {
    # nn.Module + LightningDataModule (its train_samples argument given through the config)
    "module+datamodule": (["experiment=mine", "data.train_samples=128"], 7),
    # LightningModule + a function returning Datasets (its train_samples argument too)
    "lightning+datasets": (["experiment=mine", "model=lightning",
                            "model._target_=my_project.lit.LitNet",
                            "data._target_=my_project.extra.make_datasets",
                            "data.train_samples=128"], 7),
}  # fmt: skip


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    return write_project(tmp_path_factory.mktemp("my-project"))


def tuneup(project: Path, *args: str, **environment) -> subprocess.CompletedProcess:
    """``tuneup ARGS`` run in the project, as its user runs it."""
    return subprocess.run(
        [*python(), tuneup_command(), *args],
        cwd=project,
        env=env(project, **environment),
        capture_output=True,
        text=True,
        timeout=300,
    )


def newest(folder: Path) -> Path:
    return max(folder.glob("*/*"), key=lambda p: p.stat().st_mtime)


def test_documented_commands_train_and_sweep(project):
    command = blocks()["command"].split()
    assert command[0] == "tuneup"
    result = tuneup(project, *command[1:])
    assert result.returncode == 0, result.stderr[-3000:]
    trained = summary(newest(project / "outputs"))  # the run directory is under the project
    assert trained["status"] == "ok" and trained["epochs"] == 3
    assert trained["plugins"]["precision"]["ran_as"] == "bf16"  # amp on CPU
    assert trained["plugins"]["memory_format"]["converted_4d_tensors"] > 0
    assert trained["val"]["acc"] > 0.6  # chance is 0.25: the model learned the quadrants

    sweep = blocks()["sweep"].split()  # one epoch a job: the run above trained the 3 of mine.yaml
    result = tuneup(project, *sweep[1:], "trainer.max_epochs=1")
    assert result.returncode == 0, result.stderr[-3000:]
    sweep_dir = max((project / "multirun").glob("*/*"), key=lambda p: p.stat().st_mtime)
    runs = [summary(sweep_dir / str(job)) for job in range(4)]
    assert all(r["status"] == "ok" for r in runs)
    rows = [
        line.split("|")[1].split()[0]
        for line in (sweep_dir / "report.md").read_text().splitlines()
        if re.match(r"\| \d+ ", line)
    ]
    assert sorted(rows) == ["0", "1", "2", "3"]  # one row per run


@pytest.mark.parametrize("kind", KINDS)
def test_every_lever_on_and_exact_resume_after_a_kill(project, kind):
    overrides, kill_at = KINDS[kind]
    runs = project / "runs" / kind
    whole = tuneup(project, *overrides, *LEVERS, f"hydra.run.dir={runs / 'whole'}")
    assert whole.returncode == 0, whole.stderr[-3000:]
    done = summary(runs / "whole")
    plugins = done["plugins"]
    assert plugins["precision"]["ran_as"] == "fp16" and plugins["precision"]["loss_scaler"]
    assert plugins["memory_format"]["converted_4d_tensors"] > 0
    assert plugins["activation_checkpointing"]["checkpointed_blocks"] == 2
    assert plugins["grad_accum"]["steps"] == 2 and done["micro_batches"] == 2 * done["steps"]

    cut = runs / "cut"
    killed = tuneup(
        project, *overrides, *LEVERS, f"hydra.run.dir={cut}", KILL_AT_MICRO_BATCH=str(kill_at)
    )
    assert killed.returncode == -9, killed.stderr[-2000:]
    resumed = tuneup(project, *overrides, *LEVERS, f"hydra.run.dir={cut}", "resume=auto")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    again = summary(cut)
    assert again["resumed_from"].endswith(f"step{(kill_at - 1) // 2:08d}.ckpt")
    assert again["steps"] == done["steps"] == 4
    whole_weights, resumed_weights = final_weights(runs / "whole"), final_weights(cut)
    assert whole_weights.keys() == resumed_weights.keys()
    for name, tensor in whole_weights.items():
        assert torch.equal(tensor, resumed_weights[name]), name


def test_ddp_shards_the_users_data_like_one_process_on_the_whole_batch(project):
    """2 processes of batch 16 train the weights 1 process of batch 32 does (a model without
    BatchNorm, so a batch's gradient does not depend on how it is split)."""
    common = [
        "experiment=mine",
        "model._target_=my_project.extra.Flat",
        "~model.width",
        "data._target_=my_project.extra.make_datasets",
        "trainer.max_epochs=1",
        "trainer.accelerator=cpu",
        "optimizer.momentum=0.0",
        "optimizer.nesterov=false",
    ]
    runs = project / "runs" / "ddp"
    one = tuneup(project, *common, "data.batch_size=32", f"hydra.run.dir={runs / 'one'}")
    assert one.returncode == 0, one.stderr[-3000:]
    two = tuneup(
        project,
        *common,
        "data.batch_size=16",
        "strategy=ddp",
        "trainer.devices=2",
        f"hydra.run.dir={runs / 'two'}",
    )
    assert two.returncode == 0, two.stderr[-3000:]
    assert summary(runs / "two")["world_size"] == 2
    assert summary(runs / "two")["steps"] == summary(runs / "one")["steps"] == 256 // 32
    expected, got = final_weights(runs / "one"), final_weights(runs / "two")
    for name, tensor in expected.items():
        torch.testing.assert_close(got[name], tensor, rtol=1e-5, atol=1e-6)


# -- checks: in process, the project importable as it is from its own directory ---------------


@pytest.fixture
def mine(project, monkeypatch):
    """compose(overrides) as ``tuneup`` run in the project would."""
    monkeypatch.syspath_prepend(str(project))
    monkeypatch.chdir(project)

    def compose(*overrides):
        return compose_config(["experiment=mine", *overrides], tiny=False)

    return compose


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["model.num_classes=5"], "model my_project.nets.Net and data my_project.data.Quadrants "
         "do not fit: the model outputs 5 classes, the data has 4"),
        (["model._target_=torch.nn.Linear", "~model.width", "+model.in_features=7",
          "+model.out_features=4"], "model torch.nn.Linear and data my_project.data.Quadrants do "
         "not fit: the model fails on a batch of a list of a tensor [2, 3, 16, 16], a tensor [2]"),
        (["model._target_=my_project.nets.Nett"], "model._target_='my_project.nets.Nett': "
         "my_project.nets has no attribute 'Nett' (it has: Block, Net, nn, torch)"),
        (["data._target_=my_project.extra.make_datasets", "data.batch_size=null"],
         "data.batch_size is not set: data._target_=my_project.extra.make_datasets returns Datasets"),
        (["model._target_=my_project.extra.Flat", "~model.width", "memory_format=channels_last"],
         "memory_format=channels_last needs a model that takes 4-D (N, C, H, W) input, but "
         "model=my_project.extra.Flat has no 2-D convolution"),
        (["activation_checkpointing=blocks", "activation_checkpointing.block_types=[Layer]"],
         "class names of the repeated blocks of model=my_project.nets.Net, which has no module"),
        (["model=lightning", "model._target_=my_project.lit.LitNet", "optimizer=lamb",
          "kernels=[cross_entropy]"], "kernels=[cross_entropy] cannot apply to model=lightning"),
        (["model=lightning", "model._target_=my_project.lit.LitNet", "optimizer=lars"],
         "optimizer=lars cannot apply to model=lightning: the LightningModule "
         "my_project.lit.LitNet builds its own optimizer in configure_optimizers"),
        (["kernels=[linear_cross_entropy]"], "kernels.ops.linear_cross_entropy.head='lm_head': "
         "model my_project.nets.Net has nothing there, not an nn.Linear"),
        (["+model.hiden=3"], "model my_project.nets.Net cannot be built with (width=16, "
         "hiden=3): TypeError: Net.__init__() got an unexpected keyword argument 'hiden'"),
        (["model=lightning", "model._target_=my_project.lit.LitNoOptimizer"],
         "model=lightning: my_project.lit.LitNoOptimizer defines no configure_optimizers, which "
         "Lightning needs to train it"),
        (["model=lightning", "model._target_=my_project.lit.LitNoForward", "compile=on"],
         "compile=on compiles the LightningModule's forward, but my_project.lit.LitNoForward "
         "defines none"),
    ],
)  # fmt: skip
def test_what_cannot_work_is_refused_naming_both_sides(mine, tmp_path, overrides, expected):
    with pytest.raises(ConfigError) as info:
        run(mine(*overrides), run_dir=tmp_path)
    assert expected in str(info.value)


def test_a_data_module_smaller_than_a_batch_is_refused_not_trained_for_0_steps(mine, tmp_path):
    from tuneup import TuneupError

    with pytest.raises(
        TuneupError,
        match=r"^data.batch_size=32 is larger than the 20 training "
        r"samples: training batches are full, so an epoch would train nothing",
    ):
        run(mine("data.train_samples=20", "checkpoint=off"), run_dir=tmp_path)


def test_kernels_swap_the_named_head_and_model_loss_trains(mine, tmp_path):
    run(
        mine(
            "kernels=[linear_cross_entropy]",
            "kernels.ops.linear_cross_entropy.head=head",
            "trainer.max_epochs=1",
        ),
        run_dir=tmp_path / "fused",
    )
    fused = summary(tmp_path / "fused")
    assert fused["plugins"]["kernels"]["swapped"] == "head (Linear 16 -> 4)"
    assert fused["kernels"]["linear_cross_entropy"] == ["reference"]
    assert fused["val"]["acc"] > 0.25

    run(
        mine(
            "model._target_=my_project.extra.OwnLoss",
            "~model.width",
            "task=model_loss",
            "trainer.max_epochs=1",
        ),
        run_dir=tmp_path / "own",
    )
    own = summary(tmp_path / "own")
    assert own["status"] == "ok" and own["val"]["loss"] < 1.4 and "acc" not in own["val"]
    assert own["flops_per_sample"] == 2 * 2 * (3 * 16 * 16) * 4  # fc forward + weight gradient


# -- tuneup's optimizer and schedule with a LightningModule's own (issue 47 point 2) ------------

LIT = ["model=lightning", "model._target_=my_project.lit.LitNet"]
#: (command-line overrides, the start of the one line they get): what would train as without them.
OWNED = [
    (["optimizer=nadamw"], "optimizer=nadamw does nothing"),
    (
        ["optimizer=adamw", "optimizer.weight_decay=0.3"],
        "optimizer=adamw optimizer.weight_decay=0.3 do nothing",
    ),
    (["optimizer.lr=0.5"], "optimizer.lr=0.5 does nothing"),
    (
        ["scheduler=wsd", "scheduler.decay_fraction=0.9"],
        "scheduler=wsd scheduler.decay_fraction=0.9 do nothing",
    ),
]


def test_tuneups_optimizer_settings_for_a_lightningmodule_are_refused_naming_its_own(mine):
    """Given on the command line, each is one line naming the LightningModule and where its own
    settings go (model.lr, the value given where it is optimizer.lr's); from a config file, and
    for an nn.Module, they are read or kept; muon and clipping keep their own lines."""
    from tuneup.trainer.components import Plan
    from tuneup.trainer.own_optimizer import own_settings_problems

    cfg = mine(*LIT)
    plan = Plan(cfg)
    for given, start in OWNED:
        (problem,) = own_settings_problems(cfg, plan, given)
        lr = "0.5" if given == ["optimizer.lr=0.5"] else "..."
        assert problem == (
            f"{start} with model=lightning: my_project.lit.LitNet builds its own "
            "optimizer and schedule in its configure_optimizers; set its own "
            f"arguments instead (it takes: width, lr), e.g. model.lr={lr}"
        )
    assert own_settings_problems(cfg, plan, ["optimizer.clip_grad_norm=1.0", "seed=3"]) == []
    muon = mine(*LIT, "optimizer=muon")
    assert own_settings_problems(muon, Plan(muon), ["optimizer=muon", "scheduler=wsd"]) == [
        own_settings_problems(cfg, plan, ["scheduler=wsd"])[0]  # muon's: its plugin's line
    ]
    net = mine()
    assert own_settings_problems(net, Plan(net), ["optimizer=nadamw"]) == []
    # a run without an end needs tuneup's schedule to know its length, not the module's own
    from tuneup.trainer.checks import core_problems
    from tuneup.trainer.environment import Environment

    endless = ["trainer.max_epochs=-1", "trainer.max_steps=-1"]
    for overrides, refused in ((LIT, False), ([], True)):
        cfg = mine(*overrides, *endless)
        found = core_problems(cfg, Environment.from_config(cfg), Plan(cfg))
        assert any("the run has no end" in p for p in found) is refused, found


def test_the_command_line_refuses_them_before_anything_is_built(project):
    run_dir = project / "runs" / "owned"
    done = tuneup(project, "experiment=mine", *LIT, "optimizer.lr=0.5", f"hydra.run.dir={run_dir}")
    assert done.returncode == 1
    assert (
        "  - optimizer.lr=0.5 does nothing with model=lightning: my_project.lit.LitNet builds "
        "its own optimizer and schedule" in done.stderr
    )
    assert not (run_dir / "checkpoints").exists()


def test_a_sweep_of_them_is_refused_before_its_first_job(project):
    """Every job would train the same; where the model is swept too, the others read them."""
    sweep_dir = project / "runs" / "owned-sweep"
    done = tuneup(
        project,
        "-m",
        "experiment=mine",
        *LIT,
        "optimizer.lr=0.1,0.5",
        f"hydra.sweep.dir={sweep_dir}",
    )
    assert done.returncode == 1
    assert done.stderr.strip() == (
        "error: optimizer.lr=0.1,0.5 does nothing with model=lightning: my_project.lit.LitNet "
        "builds its own optimizer and schedule in its configure_optimizers; set its own "
        "arguments instead (it takes: width, lr), e.g. model.lr=0.1,0.5"
    )
    assert not (sweep_dir / "0").exists()


def test_a_search_samples_the_lightningmodules_own_lr_not_tuneups(mine):
    """hparams_search=optuna's default space (optimizer.lr, optimizer.weight_decay): the
    module's model.lr over optimizer.lr's interval in their place; the same keys given by the
    user, or a model argument the model does not take, are refused."""
    from tuneup import TuneupError
    from tuneup.optuna.space import parse_space
    from tuneup.optuna.unread import default_params, fit_space, given_lines
    from tuneup.trainer.components import Plan

    def fitted(arguments, *overrides):
        params = default_params()
        cfg = mine(*overrides)
        space = fit_space(
            parse_space(params, arguments), given_lines(params, arguments), cfg, Plan(cfg)
        )
        return {k: repr(d) for k, d in space.distributions.items()}

    defaults = fitted([])  # an nn.Module: tuneup's optimizer, searched
    assert {"optimizer.lr", "optimizer.weight_decay", "data.batch_size"} == set(defaults)
    own = fitted([], *LIT)
    assert set(own) == {"model.lr", "data.batch_size"}
    assert own["model.lr"] == defaults["optimizer.lr"]  # log-uniform over the same interval
    with pytest.raises(
        TuneupError,
        match=r"^optimizer.lr=choice\(0.1, 0.2\) does nothing with "
        r"model=lightning: .* e.g. model.lr=choice\(0.1, 0.2\)$",
    ):
        fitted(["optimizer.lr=choice(0.1, 0.2)"], *LIT)
    with pytest.raises(
        TuneupError,
        match=r"^model.lr is not an argument of model "
        r"my_project.nets.Net \(it takes: width, depth, num_classes\)",
    ):
        fitted(["model.lr=choice(0.1, 0.2)"])


# -- model=lightning naming a plain nn.Module (walk 16, point 1) -------------------------------


def test_model_lightning_with_a_plain_module_is_refused_pointing_to_model_custom(mine):
    """model=custom trains an nn.Module; model=lightning must not do so silently."""
    from tuneup.trainer.components import Plan

    cfg = mine("model=lightning", "model._target_=my_project.nets.Net")
    assert Plan(cfg).problems == [
        "model=lightning needs a LightningModule, but my_project.nets.Net is a torch.nn.Module: "
        "use model=custom model._target_=my_project.nets.Net (tuneup trains it with task=, "
        "optimizer= and scheduler=)"
    ]
    odd = mine("model=lightning", "model._target_=collections.OrderedDict", "~model.width")
    assert Plan(odd).problems == [
        "model=lightning needs a LightningModule, but collections.OrderedDict makes "
        "OrderedDict objects, not torch.nn.Modules"
    ]
    assert Plan(mine("model=custom", "model._target_=my_project.nets.Net")).problems == []
    assert Plan(mine("model=lightning", "model._target_=my_project.lit.LitNet")).problems == []
