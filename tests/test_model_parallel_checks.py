"""strategy=fsdp before anything starts: every problem with the mesh, the tensor-parallel plan and
the features it cannot run with, named; and the plain functions behind it (plans, blocks,
sharded checkpoint files), in one process."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from tests.conftest import compose_config, run_cli
from tuneup.plugins.strategy import layout_note, settings_problems
from tuneup.plugins.strategy.parallelize import shard_block_names
from tuneup.plugins.strategy.tensor_parallel import expand, plan_problems
from tuneup.trainer.components import Plan
from tuneup.trainer.environment import Environment
from tuneup.trainer.state import sharded
from tuneup.trainer.state.checkpoint_read import UnreadableCheckpoint

GPT = [
    "model=gpt",
    "data=synthetic_tokens",
    "model.width=16",
    "model.heads=4",
    "trainer.accelerator=cpu",
    "strategy=fsdp",
]


def problems(*overrides):
    cfg = compose_config([*GPT, *overrides])
    return settings_problems(cfg, Environment.from_config(cfg), Plan(cfg))


def test_a_sound_fsdp_and_tp_config_has_no_problem():
    assert problems("trainer.devices=4", "strategy.tensor_parallel_size=2") == []
    assert (
        problems(
            "trainer.devices=2",
            "strategy.sequence_parallel=true",
            "strategy.tensor_parallel_size=2",
        )
        == []
    )


def test_one_process_is_said_with_the_devices_the_user_gave():
    """A resume on one process (trainer.devices=1) was told 'trainer.devices=auto'."""
    for devices, said in (
        ("1", "strategy=fsdp with trainer.devices=1: one process"),
        ("auto", "strategy=fsdp with trainer.devices=auto on cpu: one device"),
    ):
        cfg = compose_config([*GPT, f"trainer.devices={devices}"])
        assert problems(f"trainer.devices={devices}") == []
        assert layout_note(cfg, Environment.from_config(cfg)).startswith(said)


def test_a_tensor_parallel_size_that_does_not_divide_the_world_is_named():
    (found,) = problems("trainer.devices=4", "strategy.tensor_parallel_size=3")
    assert "strategy.tensor_parallel_size=3 does not divide the 4 process(es)" in found


def test_a_pattern_that_matches_no_module_is_named_with_the_models_modules():
    (found,) = problems(
        "trainer.devices=2",
        "strategy.tensor_parallel_size=2",
        "strategy.tp_plan={transformer.h.*.mlp.up: colwise}",
    )
    assert "strategy.tp_plan: transformer.h.*.mlp.up matches no module of the model" in found
    assert "transformer.h.0.attn.c_attn" in found  # what it could have named


def test_a_dimension_the_tp_size_does_not_divide_is_named():
    found = problems("trainer.devices=3", "strategy.tensor_parallel_size=3")
    text = "\n".join(found)
    # c_fc: 16 -> 64 features, split 3 ways; the heads (4) too
    assert "does not divide the 64 output features of transformer.h.0.mlp.c_fc (colwise)" in text
    assert "strategy.tensor_parallel_size=3 does not divide model.heads=4" in text


def test_bad_styles_modules_and_plans_are_named():
    found = problems(
        "trainer.devices=2",
        "strategy.tensor_parallel_size=2",
        "strategy.tp_plan={transformer.h.*.mlp: colwise, lm_head: diagonal}",
    )
    text = "\n".join(found)
    assert "lm_head: 'diagonal' is not allowed: expected one of colwise, rowwise" in text
    assert "transformer.h.0.mlp is a MLP; colwise splits nn.Linear" in text
    cfg = compose_config(
        [
            "model=mlp",
            "trainer.accelerator=cpu",
            "strategy=fsdp",
            "trainer.devices=2",
            "strategy.tensor_parallel_size=2",
        ],
        tiny=False,
    )
    (found,) = settings_problems(cfg, Environment.from_config(cfg), Plan(cfg))
    assert "mlp has no built-in tensor-parallel plan; give one: strategy.tp_plan=" in found


def test_what_cannot_run_under_tensor_parallelism_is_refused_by_name():
    found = problems(
        "trainer.devices=2", "strategy.tensor_parallel_size=2", "kernels=[cross_entropy]"
    )
    assert any("kernels=['cross_entropy'] with strategy.tensor_parallel_size=2" in p for p in found)
    found = problems("trainer.devices=2", "strategy.shard_blocks=[Nope]")
    assert any(
        "strategy.shard_blocks=['Nope'] is not allowed" in p and "Block," in p for p in found
    )
    found = problems(
        "trainer.devices=2",
        "strategy.sequence_parallel=true",
        "strategy.tp_plan={lm_head: colwise}",
        "strategy.tensor_parallel_size=2",
    )
    assert any("sequence_parallel=true applies to a built-in plan" in p for p in found)
    # Lightning's clipping by norm fails at step 0 under TP; ours (optimizer.clip_grad_norm) works
    found = problems(
        "trainer.devices=2", "strategy.tensor_parallel_size=2", "+trainer.gradient_clip_val=0.5"
    )
    assert (
        "trainer.gradient_clip_val=0.5 with strategy.tensor_parallel_size=2: Lightning's "
        "clipping by norm cannot add norms of tensors on different meshes; use "
        "optimizer.clip_grad_norm=0.5 (the same clipping, across meshes)"
    ) in found
    assert (
        problems(
            "trainer.devices=2", "strategy.tensor_parallel_size=2", "optimizer.clip_grad_norm=0.5"
        )
        == []
    )


def test_what_cannot_run_under_fsdp_is_refused_by_name():
    found = problems(
        "trainer.devices=2", "kernels=[linear_cross_entropy]", "strategy.cpu_offload=true"
    )
    assert any("kernels=[linear_cross_entropy] with strategy=fsdp" in p for p in found)
    assert any("strategy.cpu_offload=true" in p and "needs CUDA" in p for p in found)
    assert problems("trainer.devices=2", "kernels=[cross_entropy]") == []


def test_fp8_under_fsdp_all_gathers_float8_where_the_recipe_allows():
    from tuneup.plugins.precision.fp8 import fp8_config

    assert fp8_config("tensorwise", sharded=True).enable_fsdp_float8_all_gather
    assert not fp8_config("tensorwise").enable_fsdp_float8_all_gather
    assert not fp8_config("rowwise", sharded=True).enable_fsdp_float8_all_gather


def test_the_command_says_so_in_one_line_and_exits_1(tmp_path):
    result = run_cli(
        *GPT,
        "trainer.devices=4",
        "strategy.tensor_parallel_size=3",
        f"hydra.run.dir={tmp_path}/run",
        tiny=False,
    )
    assert result.returncode == 1
    lines = [line for line in result.stderr.splitlines() if "does not divide" in line]
    assert len(lines) == 1 and "Traceback" not in result.stderr


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(4, 8), nn.Linear(8, 4)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.layers = nn.ModuleList(Block() for _ in range(3))


def test_blocks_are_found_by_class_else_as_the_members_of_module_lists():
    net = Net()
    assert shard_block_names(net) == ["layers.0", "layers.1", "layers.2"]  # "Block": the default
    assert shard_block_names(net, ["Linear"]) == [
        f"layers.{i}.{p}" for i in range(3) for p in ("up", "down")
    ]
    net.layers = nn.ModuleList(nn.Sequential(nn.Linear(4, 4)) for _ in range(2))
    assert shard_block_names(net) == ["layers.0", "layers.1"]


def test_plan_patterns_expand_to_module_names():
    plan = {"layers.*.up": "colwise", "layers.*.down": "rowwise"}
    assert expand(Net(), plan) == {
        f"layers.{i}.{p}": s for i in range(3) for p, s in (("up", "colwise"), ("down", "rowwise"))
    }
    assert plan_problems(Net(), plan, 2) == []
    (found,) = plan_problems(Net(), {"embed": "rowwise"}, 3)
    assert "does not divide the 10 vocabulary features of embed (rowwise)" in found


def test_a_sharded_checkpoint_with_a_flipped_byte_or_no_manifest_is_unreadable(tmp_path):
    folder = tmp_path / "epoch000-step00000001.ckpt"
    folder.mkdir()
    (folder / "__0_0.distcp").write_bytes(b"shard zero")
    sharded.write_manifest(folder, {"__0_0.distcp": sharded.sha256(folder / "__0_0.distcp")})
    sharded.verify(folder)
    (folder / "__0_0.distcp").write_bytes(b"shard 0ero")
    with pytest.raises(UnreadableCheckpoint, match=r"__0_0.distcp is corrupt"):
        sharded.verify(folder)
    (folder / sharded.MANIFEST).unlink()
    with pytest.raises(UnreadableCheckpoint, match=r"has no tuneup-sha256\.json"):
        sharded.verify(folder)


def test_an_optimizer_state_keyed_by_name_is_keyed_by_position_for_a_plain_optimizer():
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(3, 2)).sum().backward()
    optimizer.step()
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    by_name = get_optimizer_state_dict(model, optimizer)
    assert set(by_name["state"]) == {"0.weight", "0.bias", "1.weight", "1.bias"}
    expected = optimizer.state_dict()
    got = sharded.by_index(json.loads(json.dumps(by_name, default=lambda t: t.tolist())))
    assert got["param_groups"][0]["params"] == expected["param_groups"][0]["params"]
    for index, state in expected["state"].items():
        assert torch.equal(
            torch.tensor(got["state"][index]["momentum_buffer"]), state["momentum_buffer"]
        )


def test_the_console_table_shows_a_row_per_process():
    from tuneup.trainer.summary import format_table

    figures = {"parameter_bytes": 10, "peak_memory_bytes": 2_000_000}
    table = format_table(
        {
            "status": "ok",
            "world_size": 2,
            "per_rank": [{"rank": 0, **figures}, {"rank": 1, **figures}],
        }
    )
    rows = [line for line in table.splitlines() if line.startswith("per_rank.")]
    assert [r.split()[0] for r in rows] == ["per_rank.0", "per_rank.1"]
    assert rows[1].endswith("parameter 10 B, peak_memory 1.91 MiB")


def test_lightnings_srun_advice_stays_off_the_console():
    """Wherever Slurm's client is installed, Lightning advises `srun` on every run; tuneup
    submits through hydra/launcher=slurm, so the line is for the log file only."""
    import logging

    from tuneup.trainer.console import ConsoleFilter

    hint = (
        "The `srun` command is available on your system but is not used. HINT: If your "
        "intention is to run Lightning on SLURM, prepend your python command with `srun`"
    )
    record = logging.LogRecord(
        "lightning_fabric.plugins.environments.slurm",
        logging.WARNING,
        __file__,
        1,
        hint,
        None,
        None,
    )
    assert ConsoleFilter().filter(record) is False
    record.msg = "a real warning"
    assert ConsoleFilter().filter(record) is True
