"""strategy=fsdp on CPU (gloo): FSDP2, tensor parallelism and both (a 2x2 mesh), on model=gpt
and on a user's own transformer (model=custom), each ending within 1e-5 (fp32, relative) of
one process on the same global batch; sharded checkpoints on disk, per-rank figures, resume
on another number of processes, and kill -9 + resume=auto with gradient accumulation.

Every run trains 2 epochs of 2 optimizer steps (32 samples, a global batch of 16), saving
every step, but those that need one epoch only (SHORT). The references train in one process
with data.batch_size=16.
"""

from __future__ import annotations

import json
import signal
import textwrap

import pytest
import torch

from tests.conftest import python, run_cli
from tests.plugin_dists import make_distribution
from tests.test_resume import CRASH
from tuneup.consolidate import consolidate
from tuneup.trainer.state import sharded
from tuneup.trainer.state.checkpoints import list_checkpoints

COMMON = [
    "data=synthetic_tokens",
    "data.context=8",
    "data.train_samples=32",
    "data.val_samples=16",
    "data.vocab_size=64",
    "trainer.max_epochs=2",
    "trainer.enable_progress_bar=false",
    "trainer.accelerator=cpu",
    "checkpoint.every_n_steps=1",
    "trainer.log_every_n_steps=1",
]
#: Clipped by total norm on every layout (the first steps' norms are 0.8 to 1: clipped).
GPT = [
    "model=gpt",
    "model.layers=2",
    "model.width=16",
    "model.heads=4",
    "optimizer.clip_grad_norm=0.6",
    *COMMON,
]
#: The user's model: model=custom by _target_, with its tensor-parallel plan given in config.
OWN = [
    "model=custom",
    "model._target_=tiny_nets.TinyTransformer",
    "model.vocab_size=64",
    "model.width=16",
    "model.layers=2",
    *COMMON,
]
OWN_PLAN = "strategy.tp_plan={blocks.*.up: colwise, blocks.*.down: rowwise}"
#: (processes, tensor_parallel_size, data.batch_size): each sees a global batch of 16.
LAYOUTS = {"fsdp": (2, 1, 8), "tp": (2, 2, 16), "2d": (4, 2, 8)}
#: model=gpt's tensor parallelism with sequence parallelism (its norms on sequence shards);
#: plain tensor parallelism is the user's model's (and GPT-2's) below.
GPT_LAYOUTS = ["fsdp", "tp-sequence", "2d"]
ONE_THREAD = {"OMP_NUM_THREADS": "1"}
#: One epoch (2 steps), saved at its end only: for what 2 steps say as well as 4 (a run
#: compared with a reference shortened alike: the learning rate's schedule spans the run).
SHORT = ["trainer.max_epochs=1", "checkpoint.every_n_steps=null"]

TINY_NETS = """
    import torch
    from torch import nn


    class Block(nn.Module):
        def __init__(self, width):
            super().__init__()
            self.norm = nn.LayerNorm(width)
            self.up = nn.Linear(width, 4 * width)
            self.down = nn.Linear(4 * width, width)

        def forward(self, x):
            return x + self.down(torch.relu(self.up(self.norm(x))))


    class TinyTransformer(nn.Module):
        def __init__(self, vocab_size, width, layers):
            super().__init__()
            self.embed = nn.Embedding(vocab_size, width)
            self.blocks = nn.ModuleList(Block(width) for _ in range(layers))
            self.head = nn.Linear(width, vocab_size)

        def forward(self, tokens):
            x = self.embed(tokens)
            for block in self.blocks:
                x = block(x)
            return self.head(x)
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The user's project (tiny_nets) and the crash plugin, on PYTHONPATH of the runs."""
    site = tmp_path_factory.mktemp("site")
    (site / "tiny_nets.py").write_text(textwrap.dedent(TINY_NETS))
    make_distribution(
        site, "tuneup-crash", {"tuneup_crash": CRASH}, {"crash": "tuneup_crash:Plugin"}
    )
    return site


def train(run_dir, *args, site, crash: dict | None = None, ok=True):
    env = {**ONE_THREAD, "PYTHONPATH": str(site), **(crash or {})}
    result = run_cli(f"hydra.run.dir={run_dir}", *args, tiny=False, env=env)
    if ok:
        assert result.returncode == 0, result.stderr[-3000:]
    return result


def layout(name: str) -> list[str]:
    if name == "tp-sequence":
        return [*layout("tp"), "strategy.sequence_parallel=true"]
    processes, tp, batch = LAYOUTS[name]
    return [
        "strategy=fsdp",
        f"trainer.devices={processes}",
        f"strategy.tensor_parallel_size={tp}",
        f"data.batch_size={batch}",
    ]


def weights(run_dir, tmp_path, step=None) -> dict[str, torch.Tensor]:
    """The model's own weights at ``step`` (default: the newest), through tuneup-consolidate."""
    found = list_checkpoints(run_dir / "checkpoints")
    path = (
        found[0] if step is None else next(p for p in found if p.name.endswith(f"{step:08d}.ckpt"))
    )
    return consolidate(path, tmp_path / f"{run_dir.name}-{path.stem}.pt")


def relative_difference(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).norm() / b[k].norm()) for k in b)


def summary(run_dir) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory, site):
    """``runs(name, *args)``: the run directory of an uninterrupted run, trained once."""
    done = {}

    def run_dir(name: str, *args: str):
        if name not in done:
            done[name] = tmp_path_factory.mktemp(name)
            train(done[name], *args, site=site)
        return done[name]

    return run_dir


@pytest.fixture(scope="module")
def reference(runs):
    """``reference("gpt"|"own")``: one process, data.batch_size=16."""
    return lambda model: runs(
        f"reference-{model}", *(GPT if model == "gpt" else OWN), "data.batch_size=16"
    )


@pytest.fixture(scope="module")
def gpt_runs(runs):
    """``gpt_runs(layout)``: model=gpt trained under that layout."""
    return lambda name: runs(f"gpt-{name}", *GPT, *layout(name))


# -- model=gpt: equal to one process, on disk and in the summary -------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("name", GPT_LAYOUTS)
def test_gpt_under_fsdp_tp_and_2d_ends_as_one_process_on_the_same_batch(
    tmp_path, name, reference, gpt_runs
):
    run_dir = gpt_runs(name)
    processes, tp, _ = LAYOUTS[name.removesuffix("-sequence")]
    expected = weights(reference("gpt"), tmp_path)
    assert relative_difference(weights(run_dir, tmp_path), expected) < 1e-5
    # the comparison can fail: one step earlier is far from the end
    assert relative_difference(weights(reference("gpt"), tmp_path, step=3), expected) > 1e-3

    done = summary(run_dir)
    assert done["status"] == "ok" and done["world_size"] == processes and done["steps"] == 4
    assert done["effective_batch_size"] == 16  # per data shard x shards, not x processes
    # clipping by the total norm across meshes (TP's DTensors beside plain tensors) equals one
    # process's: the same norms, the same steps clipped (issue 32 point 6.2)
    clipped = summary(reference("gpt"))["grad_norm"]
    assert (
        0 < clipped["clipped_steps"] < 4
        and done["grad_norm"]["clipped_steps"] == clipped["clipped_steps"]
    )
    assert done["grad_norm"]["max"] == pytest.approx(clipped["max"], rel=1e-5)
    assert done["grad_norm"]["last"] == pytest.approx(clipped["last"], rel=1e-5)
    strategy = done["plugins"]["strategy"]
    assert strategy["mesh"] == {"data_parallel": processes // tp, "tensor_parallel": tp}
    # samples over the data shards: a tensor-parallel group's ranks share theirs (2 x 32)
    assert done["samples"] == done["samples_this_session"] == 64
    meta = torch.load(list_checkpoints(run_dir / "checkpoints")[0] / "meta.pt", weights_only=True)
    assert meta["tuneup"]["measure"]["samples"] == 64
    assert strategy["sharded_blocks"] == 2 and strategy["initialised_by"] == "broadcast"
    # 4 Linear per block; with sequence parallelism also 2 norms per block, and where the
    # sequence-sharded part begins and ends
    split = {"fsdp": 0, "2d": 8, "tp-sequence": 8 + 4 + 2}[name]
    assert strategy["tensor_parallel_modules"] == split

    # A sharded checkpoint: a directory, a shard per rank, checksums of every file.
    newest = list_checkpoints(run_dir / "checkpoints")[0]
    files = sorted(p.name for p in newest.iterdir())
    assert files == sorted(
        [".metadata", "meta.pt", sharded.MANIFEST, *(f"__{r}_0.distcp" for r in range(processes))]
    )
    assert set(json.loads((newest / sharded.MANIFEST).read_text())["sha256"]) == set(files) - {
        sharded.MANIFEST
    }

    # Per-rank figures, measured: what each rank holds and what it sent in one step.
    one = summary(reference("gpt"))["per_rank"][0]
    ranks = done["per_rank"]
    assert [r["rank"] for r in ranks] == list(range(processes))
    for rank in ranks:
        assert rank["peak_memory_bytes"] > 0
        assert rank["optimizer_state_bytes"] == rank["parameter_bytes"]  # SGD: a momentum each
        if name == "fsdp":  # every parameter sharded in two: half of one process's
            assert rank["parameter_bytes"] == pytest.approx(one["parameter_bytes"] / 2, rel=0.02)
            assert rank["all_gather_bytes_per_step"] >= one["parameter_bytes"]
            assert rank["reduce_scatter_bytes_per_step"] == one["parameter_bytes"]
            # gradients are reduce-scattered; all-reduced: only the logged loss's mean over the
            # data shards (one float32; the first step is a logging one)
            assert rank["all_reduce_bytes_per_step"] == 4
        else:  # tensor parallelism splits the blocks' matmuls, sums their outputs
            shards = processes  # 2d: FSDP shards what tensor parallelism split, and the rest
            assert (
                one["parameter_bytes"] / shards
                < rank["parameter_bytes"]
                < one["parameter_bytes"] / (shards // 2)
            )
            if name == "tp-sequence":  # activations gathered and reduce-scattered by sequence
                assert rank["all_gather_bytes_per_step"] > 0
                assert rank["reduce_scatter_bytes_per_step"] > 0
            assert rank["all_reduce_bytes_per_step"] > 0


@pytest.mark.slow
@pytest.mark.parametrize(("source", "target"), [("2d", "fsdp"), ("fsdp", None), (None, "fsdp")])
def test_a_checkpoint_resumes_on_another_number_of_processes(
    tmp_path, source, target, reference, gpt_runs, site, request
):
    """4 -> 2 (a 2x2 mesh's checkpoint into FSDP x2), 2 -> 1 (FSDP into strategy=auto) and
    1 -> 2 (a single file into FSDP): DCP reshards the weights and the optimizer state; at an
    epoch end each epoch keeps its order, so with the same global batch the run ends as the
    uninterrupted one. 4 -> 2 is the run of :func:`resumed_past_damage` (resume=auto reaches
    the 2x2 mesh's checkpoint past two damaged ones)."""
    if source == "2d":
        run_dir, *_, result = request.getfixturevalue("resumed_past_damage")
    else:
        start = reference("gpt") if source is None else gpt_runs(source)
        start = list_checkpoints(start / "checkpoints")
        start = next(p for p in start if p.name.endswith("step00000002.ckpt"))  # epoch 1's end
        where = layout(target) if target else ["data.batch_size=16"]
        run_dir, result = tmp_path, train(tmp_path, *GPT, *where, f"resume={start}", site=site)
    assert (
        relative_difference(weights(run_dir, tmp_path), weights(reference("gpt"), tmp_path)) < 1e-5
    )
    note, said = (
        "each epoch keeps its order (the seeded permutation)",
        result.stdout + result.stderr,
    )
    if target is None:
        assert "world size: 2 -> 1" in said and note in said
        assert summary(run_dir)["plugins"]["strategy"]["used"] == "single process"
    elif source is None:
        assert "world size: 1 -> 2" in said and note in said
        assert list_checkpoints(run_dir / "checkpoints")[0].is_dir()
    else:
        assert "world size: 4 -> 2" in said and "data order is unchanged" in said


# -- the user's own model: gradient accumulation, kill -9, resume=auto --------------------------


@pytest.mark.slow
@pytest.mark.parametrize("name", ["2d"])
def test_own_model_with_accumulation_killed_and_resumed_ends_as_one_process(
    tmp_path, name, reference, site
):
    """grad_accum.steps=2 (half the batch): 8 micro-batches; SIGKILL every rank in micro-batch
    7, the first of step 4's window in epoch 2; resume=auto continues from step 3. On the 2x2
    mesh alone: FSDP and tensor parallelism alone are its two dimensions (the same
    accumulation window, plugins/strategy/build.py's block_backward_sync on the FSDP roots, on
    a mesh of 1 or 2 dimensions; FSDP x2 alone was a case of its own, 4.5 CPU-s)."""
    _, tp, batch = LAYOUTS[name]
    # its modules' reset_parameters, on the shards, in its order: the weights of one process
    args = [
        *OWN,
        *layout(name)[:-1],
        f"data.batch_size={batch // 2}",
        "grad_accum.steps=2",
        "strategy.init=reset_parameters",
    ]
    args += [OWN_PLAN] if tp > 1 else []
    killed = train(tmp_path, *args, site=site, crash={"CRASH_AT_MICRO_BATCH": "7"}, ok=False)
    assert killed.returncode in (-signal.SIGKILL, 1, 137), killed.stderr[-3000:]
    assert list_checkpoints(tmp_path / "checkpoints")[0].name.endswith("step00000003.ckpt")

    train(tmp_path, *args, "resume=auto", site=site)
    done = summary(tmp_path)
    assert done["status"] == "ok" and done["steps"] == 4
    assert done["resumed_from"].endswith("step00000003.ckpt")
    assert done["plugins"]["strategy"]["initialised_by"] == "reset_parameters"
    assert (
        relative_difference(weights(tmp_path, tmp_path), weights(reference("own"), tmp_path)) < 1e-5
    )
    # no reduce-scatter on the window's first micro-batch: one per step, of the gradients of
    # what the rank's data-parallel group holds (FSDP shards it in 2; twice that if not)
    for rank in done["per_rank"]:
        assert rank["reduce_scatter_bytes_per_step"] == 2 * rank["parameter_bytes"]


# -- tuneup's own plugins under FSDP2 -------------------------------------------------------


@pytest.mark.slow
def test_checkpointing_and_compile_compose_with_fsdp_in_torchtitans_order(
    tmp_path, reference, site
):
    """activation_checkpointing=selective (applied to the blocks before sharding), compile=on
    (each block compiled, then sharded) and the fused loss kernel: the same weights as one
    process. No validation: compiling the blocks again for evaluation (1 CPU-s) is no part of
    it."""
    train(
        tmp_path,
        *GPT,
        *layout("fsdp"),
        "activation_checkpointing=selective",
        "activation_checkpointing.block_types=[Block]",
        "compile=on",
        "compile.backend=aot_eager",
        "kernels=[cross_entropy]",
        "+trainer.limit_val_batches=0",
        site=site,
    )
    assert (
        relative_difference(weights(tmp_path, tmp_path), weights(reference("gpt"), tmp_path)) < 1e-5
    )
    plugins = summary(tmp_path)["plugins"]
    assert plugins["activation_checkpointing"]["checkpointed_blocks"] == 2
    assert plugins["strategy"]["compiled_blocks"] == 2 and plugins["compile"]["per_block"]


@pytest.mark.slow
def test_bf16_and_fp8_under_fsdp_gather_fewer_bytes(tmp_path, gpt_runs, site):
    """precision=bf16 is FSDP2's MixedPrecisionPolicy: parameters all-gathered (and computed)
    in bf16, half the bytes of fp32's; gradients reduced in fp32; the weights stay fp32."""
    # bytes per step and dtypes: one epoch (2 steps), saved at its end only, says them all
    train(tmp_path, *GPT, *layout("fsdp"), "precision=bf16", *SHORT, site=site)
    done, fp32 = summary(tmp_path), summary(gpt_runs("fsdp"))
    assert done["plugins"]["strategy"]["mixed_precision"] == "torch.bfloat16"
    assert done["precision"]["fsdp_param_dtype"] == "bfloat16"
    half, full = done["per_rank"][0], fp32["per_rank"][0]
    assert half["all_gather_bytes_per_step"] == full["all_gather_bytes_per_step"] // 2
    assert half["reduce_scatter_bytes_per_step"] == full["reduce_scatter_bytes_per_step"]
    assert all(t.dtype == torch.float32 for t in weights(tmp_path, tmp_path).values())

    # precision=fp8 (emulated on CPU: float8 casts, fp32 matmuls): the float8 layers' weights
    # are all-gathered in float8, a quarter of fp32's bytes (the first and last layer in bf16)
    fp8 = tmp_path / "fp8"
    train(fp8, *GPT, *layout("fsdp"), "precision=fp8", "precision.emulate=true", *SHORT, site=site)
    assert summary(fp8)["precision"]["fp8"]["converted"]
    gathered = summary(fp8)["per_rank"][0]["all_gather_bytes_per_step"]
    assert gathered < half["all_gather_bytes_per_step"] * 0.75


# -- sharded checkpoints: pruned, verified, consolidated --------------------------------------


@pytest.fixture(scope="module")
def resumed_past_damage(tmp_path_factory, gpt_runs, site):
    """(run dir, its checkpoints, the flipped shard's bytes, the result): a copy of
    gpt_runs("fsdp") (keep_last=3: steps 4, 3 and 2) whose newest checkpoint has a flipped byte
    in rank 1's shard, whose step 3 lost its manifest, and whose step 2 (epoch 1's end) is
    gpt_runs("2d")'s, resumed with resume=auto on FSDP x2: one run for both tests."""
    import shutil

    run_dir = tmp_path_factory.mktemp("damaged") / "run"
    shutil.copytree(gpt_runs("fsdp"), run_dir)
    kept = list_checkpoints(run_dir / "checkpoints")
    assert [p.name[-13:] for p in kept] == ["00000004.ckpt", "00000003.ckpt", "00000002.ckpt"]
    shutil.rmtree(kept[2])
    (mesh,) = (
        p for p in list_checkpoints(gpt_runs("2d") / "checkpoints") if p.name == kept[2].name
    )
    shutil.copytree(mesh, kept[2])
    shard = kept[0] / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    (kept[1] / sharded.MANIFEST).unlink()
    result = train(run_dir, *GPT, *layout("fsdp"), "resume=auto", site=site)
    return run_dir, kept, bytes(data), result


@pytest.mark.slow
def test_a_damaged_shard_is_skipped_saying_so_and_the_run_resumes_from_the_one_before(
    tmp_path, reference, resumed_past_damage
):
    """keep_last=3 prunes directories as it prunes files; a flipped byte in the newest
    checkpoint's shard of rank 1 fails its checksum: resume=auto names it and continues from
    the previous checkpoint, and still ends as the uninterrupted run. The step before lost its
    manifest (a save killed before its last file): skipped too. Both are set aside into
    checkpoints/damaged/ as single files are, named in the summary, and their steps saved anew
    beside them (before: not set aside, and the next save replaced the damaged directory).
    The checkpoint resumed is the 2x2 mesh's (the 4 -> 2 case of the test above)."""
    run_dir, kept, data, result = resumed_past_damage
    shard = kept[0] / "__1_0.distcp"
    said = result.stdout + result.stderr
    assert f"{shard} is corrupt" in said and "skipping a bad checkpoint" in said
    assert f"{kept[1]} is not a complete sharded checkpoint" in said
    done = summary(run_dir)
    assert done["resumed_from"].endswith("step00000002.ckpt")
    aside = run_dir / "checkpoints" / "damaged"
    assert done["checkpoints"]["damaged"] == [str(aside / p.name) for p in (kept[1], kept[0])]
    assert (aside / kept[0].name / "__1_0.distcp").read_bytes() == data  # as it was
    assert [p.name for p in list_checkpoints(run_dir / "checkpoints")] == [p.name for p in kept]
    assert (
        relative_difference(weights(run_dir, tmp_path), weights(reference("gpt"), tmp_path)) < 1e-5
    )


def test_tuneup_consolidate_writes_the_users_own_state_dict_for_plain_torch(
    tmp_path, gpt_runs, site
):
    """The console script, on a sharded checkpoint of a 2x2 mesh: the model's own parameter
    names and full tensors, loaded without tuneup by torch.load + load_state_dict."""
    import subprocess

    from tuneup.zoo.models.gpt import GPT as Gpt

    newest = list_checkpoints(gpt_runs("2d") / "checkpoints")[0]
    out = tmp_path / "model.pt"
    command = [*python(), "-m", "tuneup.consolidate", str(newest), str(out)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith(f"wrote {out}: 29 tensors")
    state = torch.load(out, weights_only=True)
    assert "transformer.h.1.mlp.c_fc.weight" in state  # its own names: no "model." prefix
    model = Gpt(vocab_size=64, context=8, layers=2, heads=4, width=16)
    assert str(model.load_state_dict(state)) == "<All keys matched successfully>"
    bad = subprocess.run(
        [*command[:-2], str(tmp_path / "nothing"), str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (
        bad.returncode == 1
        and bad.stderr.startswith("error: ")
        and "no such checkpoint" in bad.stderr
    )


@pytest.mark.slow
def test_the_docs_gpt2_plan_splits_a_transformers_gpt2_and_ends_as_one_process(tmp_path, site):
    """docs/distributed.md's plan for transformers' GPT2LMHeadModel (its Conv1D MLP split
    column- then row-wise, the attention whole) on 2 processes, against one process, for an
    epoch (2 steps)."""
    import re

    import yaml

    from tests.conftest import ROOT

    text = (ROOT / "docs" / "distributed.md").read_text()
    block = re.search(r"<!-- tested:gpt2-tp-plan -->\n```yaml\n(.*?)```", text, re.S).group(1)
    strategy = yaml.safe_load(block)["strategy"]
    plan = ", ".join(f"{k}: {v}" for k, v in strategy["tp_plan"].items())
    gpt2 = [
        "model=custom",
        "model._target_=tests.hf_models.tiny_gpt2",
        "model.use_cache=false",
        "task=next_token",
        "data.vocab_size=32",
        "data.context=16",
        *[a for a in COMMON if not a.startswith(("data.vocab_size", "data.context"))],
        *SHORT,
    ]
    env = {"PYTHONPATH": f"{ROOT}"}
    one, split = tmp_path / "one", tmp_path / "split"
    for run_dir, args in (
        (one, ["data.batch_size=16"]),
        (
            split,
            [
                "data.batch_size=16",
                "strategy=fsdp",
                "trainer.devices=2",
                f"strategy.tensor_parallel_size={strategy['tensor_parallel_size']}",
                f"strategy.tp_plan={{{plan}}}",
                "strategy.init=broadcast",
            ],
        ),
    ):
        result = run_cli(
            f"hydra.run.dir={run_dir}",
            *gpt2,
            *args,
            tiny=False,
            env={**ONE_THREAD, **env, "PYTHONPATH": f"{ROOT}:{site}"},
        )
        assert result.returncode == 0, result.stderr[-3000:]
    described = summary(split)["plugins"]["strategy"]
    assert described["tensor_parallel_modules"] == 4  # 2 blocks x 2
    # transformers' init on the shards is not one process's draw: rank 0's build, broadcast, is
    assert described["initialised_by"] == "broadcast"
    assert relative_difference(weights(split, tmp_path), weights(one, tmp_path)) < 1e-5


@pytest.mark.slow
def test_changed_settings_take_effect_on_a_resumed_sharded_checkpoint(tmp_path, gpt_runs, site):
    """As for a single file: optimizer.* changed on resume is used from the resumed step on
    (Lightning restores a sharded checkpoint's optimizer with its saved settings); and
    precision=fp16 from there on trains in fp16 under FSDP2's policy, with the loss scaler
    that agrees across the shards."""
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(gpt_runs("fsdp"), run_dir)
    result = train(
        run_dir,
        *GPT,
        *layout("fsdp"),
        "resume=auto",
        "trainer.max_epochs=3",
        "optimizer.momentum=0.5",
        "precision=fp16",
        site=site,
    )
    said = result.stdout + result.stderr
    assert "optimizer.momentum: 0.9 -> 0.5: takes effect from step 4" in said
    assert said.count("with changed settings:") == 1  # once, not once per process
    newest = list_checkpoints(run_dir / "checkpoints")[0]
    assert newest.name.endswith("step00000006.ckpt")
    (group,) = sharded.full_checkpoint(newest)["optimizer_states"][0]["param_groups"]
    assert group["momentum"] == 0.5

    scaled, fp32 = summary(run_dir), summary(gpt_runs("fsdp"))
    assert scaled["status"] == "ok" and scaled["precision"]["fsdp_param_dtype"] == "float16"
    assert scaled["precision"]["loss_scale"] > 0 and scaled["precision"]["skipped_steps"] == 0
    gathered = scaled["per_rank"][0]["all_gather_bytes_per_step"]
    assert gathered == fp32["per_rank"][0]["all_gather_bytes_per_step"] // 2
