"""Bad input met by a new user on plugins and processes: each is one ``error:`` line that names
the key, the value and what is allowed, said once however many processes find it."""

from __future__ import annotations

import pytest

from tests.conftest import compose_config
from tuneup import cli
from tuneup.trainer.hints import override_hints
from tuneup.trainer.plugin_manager import PluginError, PluginManager


def test_the_group_of_a_plugin_package_not_installed_is_one_line():
    """``myplugin=on`` before its package is installed: Hydra's seven lines ("Key 'myplugin' is
    not in struct", "use +myplugin=on", which would be refused) become one naming the cure."""
    assert override_hints(["notaplugin=on"]) == [
        "notaplugin=on: notaplugin is not a config group or setting, nor the group of an "
        "installed plugin package (install the package first); tuneup --help lists the groups "
        "and their options, tuneup plugins.list=true the installed plugins"
    ]
    assert override_hints(["notaplugin.every=2"]) == [
        "notaplugin.every=2: notaplugin is not a config group or setting, nor the group of an "
        "installed plugin package (install the package first); tuneup --help lists the groups "
        "and their options, tuneup plugins.list=true the installed plugins"
    ]


def test_a_name_in_plugins_disable_that_no_plugin_has_is_refused():
    """A mistyped ``plugins.disable=[emma]`` would leave ``ema`` on without a word."""
    with pytest.raises(PluginError) as info:
        PluginManager.from_config(compose_config(["plugins.disable=[ema,nosuch]"]))
    message = str(info.value)
    assert message.startswith(
        "plugins.disable=[ema,nosuch] names 'nosuch', which is not an installed plugin; "
        "allowed: activation_checkpointing, "
    )
    allowed = message.split("allowed: ")[1].split(", ")
    assert "ema" in allowed and "measure" not in allowed  # measure cannot be disabled


@pytest.mark.parametrize(("local_rank", "said"), [("0", True), ("3", False)])
def test_an_error_every_process_finds_is_said_once(monkeypatch, capsys, local_rank, said):
    """A batch larger than each process's share fails in every process alike: only the first
    one on the console says it, without a rank (64 processes printed it 64 times)."""
    from tuneup.trainer import console, runner
    from tuneup.trainer.state.data_order import ResumableSampler, check_a_full_batch

    def too_large_a_batch(cfg):
        try:
            check_a_full_batch(ResumableSampler(512, num_replicas=64), 32)
        except Exception as exc:
            exc.tuneup_rank = int(local_rank)  # as the runner notes it on a failure
            raise

    monkeypatch.setenv("LOCAL_RANK", local_rank)
    monkeypatch.setattr(runner, "run", too_large_a_batch)
    monkeypatch.setattr(console, "route_libraries", lambda: None)
    with pytest.raises(SystemExit) as exit_:
        cli.task(None)
    assert exit_.value.code == 1
    line = (
        "error: data.batch_size=32 is larger than the 8 training samples of each of the 64 "
        "processes (512 in all): training batches are full, so an epoch would train nothing; "
        "lower data.batch_size to 8 or less, or give more training samples\n"
    )
    assert capsys.readouterr().err == (line if said else "")


@pytest.mark.parametrize(("local_rank", "said"), [("0", 1), ("1", 0)])
def test_more_processes_than_cores_is_said_once(monkeypatch, caplog, local_rank, said):
    """Every process runs the checks: the note on too many CPU processes came once per process."""
    from tuneup.plugins.strategy import Plugin
    from tuneup.trainer.environment import Environment

    monkeypatch.setenv("LOCAL_RANK", local_rank)
    monkeypatch.setattr("tuneup.plugins.strategy.checks.usable_cpus", lambda: 2)
    cfg = compose_config(["strategy=ddp", "trainer.accelerator=cpu", "trainer.devices=4"])
    with caplog.at_level("WARNING", logger="tuneup.plugins.strategy"):
        assert Plugin(cfg).check(cfg=cfg, env=Environment.from_config(cfg), plan=None) == []
    notes = [r for r in caplog.records if "each gets less than a core" in r.getMessage()]
    assert len(notes) == said


def test_a_plugin_that_fails_to_start_on_a_missing_setting_is_one_line():
    """A plugin's ``__init__`` reading a setting its group lacks (``cfg.myplugin.evry``):
    OmegaConf's ``full_key:`` and ``object_type=`` lines were printed after the error line."""
    from tuneup.trainer.plugin_manager import _instantiate

    class Plugin:
        def __init__(self, cfg):
            self.every = cfg.model.evry

    with pytest.raises(PluginError) as info:
        _instantiate(Plugin, compose_config(), "myplugin")
    assert str(info.value) == (
        "plugin 'myplugin' failed to start: ConfigAttributeError: Key 'evry' is not in struct"
    )


def test_a_lightning_module_without_training_step_is_told_what_training_step_does():
    """The line for a missing ``training_step`` explained ``configure_optimizers`` instead."""
    from types import SimpleNamespace

    import pytorch_lightning as pl

    from tuneup.trainer.own_optimizer import missing_hook_problems

    class NoStep(pl.LightningModule):
        def configure_optimizers(self):
            return None

    plan = SimpleNamespace(lightning=True, model_target=NoStep, model_name="my_project.NoStep")
    assert missing_hook_problems({"mode": "fit"}, plan) == [
        "model=lightning: my_project.NoStep defines no training_step, which Lightning needs to "
        "train it (training_step(self, batch, batch_idx) returns the batch's loss); define it, "
        "or evaluate a checkpoint without training: mode=validate resume=<checkpoint>"
    ]


def test_the_summary_says_tensor_parallelism_ran():
    """strategy=fsdp strategy.tensor_parallel_size=2: the console said strategy=fsdp and
    world_size 2 only, as for FSDP over 2 processes; the mesh tells them apart."""
    from tuneup.trainer.summary import format_table

    mesh = {"data_parallel": 1, "tensor_parallel": 2}
    summary = {"status": "ok", "device": "cpu", "world_size": 2}
    tp = format_table({**summary, "plugins": {"strategy": {"name": "fsdp", "mesh": mesh}}})
    assert "world_size 2 (data_parallel 1 x tensor_parallel 2)\n" in tp
    fsdp = {"data_parallel": 2, "tensor_parallel": 1}
    alone = format_table({**summary, "plugins": {"strategy": {"name": "fsdp", "mesh": fsdp}}})
    assert "world_size 2\n" in alone


def test_pinned_memory_without_a_gpu_is_off_and_said_so():
    """dataloader.pin_memory=true on a CPU run: torch would warn and pin nothing while the
    summary said ``pin_memory: true``; a config written for a GPU still runs here."""
    from tuneup.plugins.dataloader import Plugin
    from tuneup.trainer.environment import Environment

    cfg = compose_config(["dataloader=workers", "dataloader.pin_memory=true"])
    cfg.trainer.accelerator = "cpu"
    plugin = Plugin(cfg)
    assert plugin.check(cfg=cfg) == []
    kwargs = {}
    plugin.configure_dataloader(cfg=cfg, kwargs=kwargs)
    assert kwargs["pin_memory"] is False and "pin_memory_off" not in kwargs
    described = plugin.describe()
    assert described["pin_memory"] is False
    assert described["pin_memory_off"] == "pin_memory=true pins for copies to a GPU; none on cpu"
    assert Environment.from_config(cfg).accelerator == "cpu"


def test_the_gradient_norm_under_tensor_parallelism_leaves_dtensors_advice_out(monkeypatch, caplog):
    """On a 2-D mesh, stacking the per-tensor norms made every process print DTensor's advice
    to flatten the mesh ("may give inconsistent results between ranks") at the first step."""
    import logging

    import torch

    from tuneup.trainer import clip

    def stacking(tensors, norm_type):  # as torch's get_total_norm does on a 2-D mesh's grads
        if any(t.dim() for t in tensors):  # gradients, not the per-mesh norms combined last
            logging.getLogger("torch.distributed.tensor._redistribute").warning(
                "While redistributing"
            )
        return torch.linalg.vector_norm(torch.stack([t.norm(norm_type) for t in tensors]))

    monkeypatch.setattr(torch.nn.utils, "get_total_norm", stacking)
    monkeypatch.setattr(clip, "_any_dtensor", lambda groups: True)  # the stand-ins: DTensors
    with caplog.at_level("WARNING"):
        assert clip.total_norm([torch.ones(4), torch.ones(5)]).item() == 3.0
    assert "While redistributing" not in caplog.text


def test_several_nodes_without_a_cluster_launch_are_refused(monkeypatch):
    """``trainer.num_nodes=2`` typed on one machine: the processes waited 60 s for the other
    node, then each printed a DistStoreError traceback and the command was killed (137)."""
    from tuneup import TuneupError
    from tuneup.plugins.strategy import Plugin, slurm

    for name in (*slurm.NODE_LAUNCH_VARIABLES, "SLURM_NTASKS"):
        monkeypatch.delenv(name, raising=False)
    cfg = compose_config(["strategy=ddp", "trainer.accelerator=cpu", "trainer.devices=2"])
    cfg.trainer.num_nodes = 2
    with pytest.raises(TuneupError) as info:  # before Lightning starts any process
        Plugin(cfg).configure_trainer(cfg=cfg, kwargs={})
    assert [str(info.value)] == [
        "trainer.num_nodes=2, but no cluster started this command on each node (no Slurm job, "
        "no NODE_RANK and MASTER_ADDR): alone it would wait for the other nodes and time out; "
        "allowed here: trainer.num_nodes=1, or start it with srun, hydra/launcher=slurm, or "
        "NODE_RANK and MASTER_ADDR set on each node (docs/slurm.md)"
    ]
    from tuneup.trainer.plugin_manager import PluginManager

    error = PluginManager._error("strategy", "configure_trainer", info.value)
    assert str(error) == f"[strategy] {info.value}"  # the refusal as check's, no hook's name
    monkeypatch.setenv("NODE_RANK", "1")  # Lightning's manual launch, on each node
    assert slurm.lone_node_problems(2) == []


def test_the_name_of_an_installed_plugin_without_a_group_is_told_it_is_always_on(
    tmp_path, monkeypatch
):
    """``hello=on`` for docs/plugins.md's tuneup-hello (no conf/): installed, so "install the
    package first" would mislead; it is on in every run."""
    from tests.plugin_dists import make_distribution

    monkeypatch.syspath_prepend(str(tmp_path))
    make_distribution(
        tmp_path, "tuneup-hi", {"tuneup_hi": "class Plugin: ..."}, {"hi": "tuneup_hi:Plugin"}
    )
    assert override_hints(["hi=on"]) == [
        "hi=on: plugin 'hi' is installed but has no config group to switch it: it is on in "
        "every run (plugins.disable=[hi] leaves it out)"
    ]


def test_a_setting_under_the_presets_group_is_named_as_such():
    """``experiment.foo=1``: "did you mean experiment.foo=1? (experiment is not a config group
    or setting)" suggested the key as typed and called a group none."""
    assert override_hints(["experiment.foo=1"]) == [
        "experiment.foo=1: experiment is a config group of presets, which set keys of other "
        "groups, and has no settings of its own; choose one: experiment=<option> (tuneup --help "
        "lists them)"
    ]
