"""FSDP and DDP on one GPU, and checkpoint save + exact resume on a GPU.

Marked ``gpu``: skipped, saying why, without CUDA. The runs go through ``python run.py``
(a subprocess each), so process groups and CUDA state never outlive a test.

- FSDP with ``trainer.devices=1`` trains like a plain single-process run.
- Two processes on one GPU: Lightning gives each process a GPU of its own, so this case is
  torch's DDP/FSDP driven directly. NCCL refuses two ranks on one GPU ("Duplicate GPU
  detected") on current releases; DDP then runs over gloo, FSDP (which needs NCCL's
  reduce-scatter) is skipped saying so.
- Resume: a run resumed from a mid-run checkpoint ends with the uninterrupted run's weights,
  bit for bit under ``trainer.deterministic`` (cuBLAS's workspace fixed), and within a
  stated tolerance for a model with dropout without it (its CUDA RNG state comes back).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu

GPU = "trainer.accelerator=gpu"
#: model=mlp: no BatchNorm, 8 micro-batches of 32 per epoch.
MLP = [
    "model=mlp",
    "model.hidden=[64]",
    "data.train_samples=256",
    "data.val_samples=64",
    "data.batch_size=32",
    "trainer.max_epochs=2",
    "trainer.enable_progress_bar=false",
    "trainer.log_every_n_steps=1",
    GPU,
]
#: GPT with dropout: resuming right needs the CUDA RNG state back.
GPT = [
    "model=gpt",
    "model.layers=2",
    "model.width=64",
    "model.heads=2",
    "model.dropout=0.1",
    "data=synthetic_tokens",
    "data.context=32",
    "data.vocab_size=128",
    "data.train_samples=256",
    "data.val_samples=32",
    "data.batch_size=32",
    "trainer.max_epochs=2",
    "trainer.enable_progress_bar=false",
    GPU,
]
#: cuBLAS picks deterministic kernels only with a fixed workspace, set before it starts.
DETERMINISTIC_ENV = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}


def summary_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def weights_at(run_dir: Path, step: int | None = None) -> dict[str, torch.Tensor]:
    """The state dict of the checkpoint after optimizer step `step` (None: the last one)."""
    from tuneup.consolidate import read  # a file, or strategy=fsdp's sharded directory

    pattern = "*.ckpt" if step is None else f"*step{step:08d}.ckpt"
    path = max((run_dir / "checkpoints").glob(pattern))
    return read(path)["state_dict"]


def succeeded(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]


# --- FSDP, one device --------------------------------------------------------------------


def test_fsdp_on_one_gpu_trains_like_a_single_process(cli, tmp_path):
    succeeded(
        cli(*MLP, "strategy=fsdp", "trainer.devices=1", run_dir=tmp_path / "fsdp", tiny=False)
    )
    succeeded(cli(*MLP, run_dir=tmp_path / "plain", tiny=False))
    fsdp, plain = summary_of(tmp_path / "fsdp"), summary_of(tmp_path / "plain")
    assert fsdp["plugins"]["strategy"]["used"] == "fsdp" and fsdp["world_size"] == 1
    assert fsdp["train_loss"] == pytest.approx(plain["train_loss"], rel=1e-4)
    assert fsdp["val"]["loss"] == pytest.approx(plain["val"]["loss"], rel=1e-4)
    got, expected = weights_at(tmp_path / "fsdp"), weights_at(tmp_path / "plain")
    assert got.keys() == expected.keys()  # an FSDP checkpoint loads into a plain model
    for name, value in expected.items():
        torch.testing.assert_close(got[name], value, rtol=1e-4, atol=1e-6, msg=name)


# --- two processes, one GPU --------------------------------------------------------------

TWO_RANKS = r"""
import os, sys
from datetime import timedelta
import torch, torch.distributed as dist, torch.multiprocessing as mp
from torch import nn

def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10)).cuda()

def batches():
    generator = torch.Generator().manual_seed(1)
    return [(torch.randn(16, 32, generator=generator), torch.randint(0, 10, (16,), generator=generator))
            for _ in range(3)]

def train(net, parameters, shard):
    optimizer = torch.optim.SGD(parameters, lr=0.1)
    for x, y in batches():
        x, y = x[shard].cuda(), y[shard].cuda()
        optimizer.zero_grad()
        nn.functional.cross_entropy(net(x), y).backward()
        optimizer.step()

def rank_main(rank, wrapper, backend, port, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(0)  # both ranks on the one GPU
    dist.init_process_group(backend, rank=rank, world_size=2, timeout=timedelta(seconds=60))
    net = model()
    if wrapper == "ddp":
        wrapped = nn.parallel.DistributedDataParallel(net, device_ids=[0])
    else:
        from torch.distributed.fsdp import FullyShardedDataParallel
        wrapped = FullyShardedDataParallel(net, device_id=0, use_orig_params=True)
    train(wrapped, wrapped.parameters(), slice(8 * rank, 8 * rank + 8))
    if wrapper == "fsdp":
        from torch.distributed.fsdp import FullStateDictConfig, StateDictType
        config = FullStateDictConfig(offload_to_cpu=True, rank0_only=True)
        with FullyShardedDataParallel.state_dict_type(wrapped, StateDictType.FULL_STATE_DICT, config):
            state = wrapped.state_dict()
    else:
        state = net.state_dict()
    if rank == 0:
        torch.save({k: v.cpu() for k, v in state.items()}, out)
    dist.destroy_process_group()

if __name__ == "__main__":
    wrapper, backend, port, out = sys.argv[1:]
    if backend == "none":  # the reference: one process, the whole batch of 16
        net = model()
        train(net, net.parameters(), slice(0, 16))
        torch.save({k: v.cpu() for k, v in net.state_dict().items()}, out)
    else:
        mp.spawn(rank_main, args=(wrapper, backend, int(port), out), nprocs=2)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two_ranks(
    tmp_path: Path, wrapper: str, backend: str
) -> tuple[subprocess.CompletedProcess, Path]:
    """Run TWO_RANKS; a run that hangs (as NCCL might, refusing) counts as a failed one."""
    script, out = tmp_path / "two_ranks.py", tmp_path / f"{wrapper}-{backend}.pt"
    script.write_text(TWO_RANKS)
    command = [sys.executable, str(script), wrapper, backend, str(free_port()), str(out)]
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=180), out
    except subprocess.TimeoutExpired as hung:
        return subprocess.CompletedProcess(command, 124, "", f"timed out: {hung}"), out


@pytest.mark.parametrize("wrapper", ["ddp", "fsdp"])
def test_two_processes_on_one_gpu_equal_one_process_on_the_whole_batch(
    tmp_path, wrapper, record_property
):
    result, out = two_ranks(tmp_path, wrapper, "nccl")
    backend = "nccl"
    if result.returncode != 0:
        refusal = (result.stderr.strip().splitlines() or ["(no output)"])[-1]
        if wrapper == "fsdp":
            pytest.skip(f"NCCL refused two ranks on one GPU ({refusal}); FSDP needs NCCL")
        result, out = two_ranks(tmp_path, wrapper, "gloo")
        backend = "gloo"
    record_property("backend", backend)
    assert result.returncode == 0, result.stderr[-4000:]
    reference, reference_out = two_ranks(tmp_path, wrapper, "none")
    assert reference.returncode == 0, reference.stderr[-4000:]
    got, expected = torch.load(out), torch.load(reference_out)
    assert got.keys() == expected.keys()
    for name, value in expected.items():  # averaged half-batch gradients = whole-batch ones
        torch.testing.assert_close(got[name], value, rtol=1e-5, atol=1e-6, msg=name)


# --- checkpoint save and exact resume ----------------------------------------------------


@pytest.mark.parametrize(
    ("run", "deterministic", "tolerance"),
    [
        pytest.param(MLP, True, None, id="mlp-deterministic-bitwise"),
        pytest.param(GPT, False, dict(rtol=1e-4, atol=1e-6), id="gpt-dropout-within-1e-4"),
    ],
)
def test_resume_from_a_mid_run_checkpoint_ends_with_the_uninterrupted_weights(
    cli, tmp_path, run, deterministic, tolerance
):
    """Run 16 steps with a checkpoint every 4; resume a new run from step 8 of it."""
    # "warn": deterministic kernels where torch has them; an op without one warns, not fails
    extra = ["+trainer.deterministic=warn"] if deterministic else []
    env = DETERMINISTIC_ENV if deterministic else None
    straight = tmp_path / "straight"
    succeeded(
        cli(*run, *extra, "checkpoint.every_n_steps=4", run_dir=straight, tiny=False, env=env)
    )
    middle = max((straight / "checkpoints").glob(f"*step{8:08d}.ckpt"))
    resumed = tmp_path / "resumed"
    succeeded(
        cli(
            *run,
            *extra,
            "checkpoint.every_n_steps=4",
            f"resume={middle}",
            run_dir=resumed,
            tiny=False,
            env=env,
        )
    )
    assert summary_of(resumed)["steps"] == summary_of(straight)["steps"] == 16
    got, expected = weights_at(resumed), weights_at(straight)
    assert got.keys() == expected.keys()
    for name, value in expected.items():
        if tolerance is None:
            assert torch.equal(got[name], value), name
        else:
            torch.testing.assert_close(got[name], value, msg=name, **tolerance)
    middle_weights = weights_at(straight, 8)
    assert any(not torch.equal(middle_weights[k], v) for k, v in expected.items())  # it trained on
