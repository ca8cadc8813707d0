"""grad_accum.micro_batch_size: each batch in micro-batches inside the step, the same weights as
the whole batch at once; ``auto`` halves it on out-of-memory errors (injected here by
tests/oom_plugin.py), agreed by every process, and the checkpoint keeps what it found."""

from __future__ import annotations

import csv
import json
import os
import sys
from pathlib import Path

import pytest
import torch

import tuneup
from tests.conftest import compose_config, register_in_runs, run_cli
from tests.oom_plugin import ENTRY_POINT_MODULE, OutOfMemoryAbove
from tests.plugin_dists import make_distribution
from tuneup import TuneupError
from tuneup.plugins.grad_accum import micro_batch_problems
from tuneup.plugins.grad_accum.micro_batch import batch_length, split

#: model=mlp: no BatchNorm, so a batch's gradient does not depend on how it is split.
MLP = [
    "model=mlp",
    "data.train_samples=256",
    "data.val_samples=32",
    "trainer.max_epochs=1",
    "trainer.enable_progress_bar=false",
    "trainer.log_every_n_steps=1",
    "trainer.accelerator=cpu",
    "measure.console_table=false",
]
STEPS = 3


def final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    loaded = [
        torch.load(p, map_location="cpu", weights_only=False)
        for p in (run_dir / "checkpoints").glob("*.ckpt")
    ]
    return max(loaded, key=lambda checkpoint: checkpoint["global_step"])["state_dict"]


def logged_losses(run_dir: Path) -> list[float]:
    with open(run_dir / "metrics.csv") as rows:
        return [float(row["train/loss"]) for row in csv.DictReader(rows) if row["train/loss"]]


def largest_difference(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def run(run_dir: Path, *overrides: str, plugin=None) -> dict:
    """One in-process run of model=mlp at batch 16, with ``plugin`` registered."""
    cfg = compose_config([*MLP, "data.batch_size=16", *overrides], tiny=False)
    with pytest.MonkeyPatch.context() as patch:
        register_in_runs(patch, [] if plugin is None else [plugin])
        tuneup.run(cfg, run_dir=run_dir)
    return json.loads((run_dir / "summary.json").read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The whole batch at once, and auto where more than 4 samples run out of memory, then
    resumed from its checkpoint for a step more; in fp16 (the loss scaler), the whole batch
    and fixed micro-batches of 4."""
    root = tmp_path_factory.mktemp("micro")
    found = {"auto": OutOfMemoryAbove(4), "resumed": OutOfMemoryAbove(4)}
    steps, fp16 = f"trainer.max_steps={STEPS}", "precision=fp16"
    summaries = {
        "whole": run(root / "whole", steps),
        "auto": run(root / "auto", steps, "grad_accum.micro_batch_size=auto", plugin=found["auto"]),
        "whole-fp16": run(root / "whole-fp16", steps, fp16),
        "fixed-fp16": run(root / "fixed-fp16", steps, fp16, "grad_accum.micro_batch_size=4"),
    }
    (checkpoint,) = (root / "auto" / "checkpoints").glob("*.ckpt")
    summaries["resumed"] = run(
        root / "resumed",
        f"trainer.max_steps={STEPS + 1}",
        "grad_accum.micro_batch_size=auto",
        f"resume={checkpoint}",
        plugin=found["resumed"],
    )
    return root, summaries, found


def test_auto_halves_on_out_of_memory_and_trains_the_whole_batchs_weights(runs):
    root, summaries, found = runs
    auto = summaries["auto"]
    assert auto["status"] == "ok" and auto["steps"] == STEPS
    assert auto["micro_batch_size"] == 4 and auto["micro_batch_oom_retries"] == 2  # 16 -> 8 -> 4
    assert found["auto"].raised == 2
    assert auto["plugins"]["grad_accum"]["micro_batch_size"] == "auto (found: 4)"
    assert auto["samples"] == summaries["whole"]["samples"] == STEPS * 16  # data order untouched
    assert largest_difference(final_weights(root / "auto"), final_weights(root / "whole")) < 1e-6
    assert "micro_batch_size" not in summaries["whole"]  # off: nothing added
    # metrics.csv logs the whole batch's loss, not the last chunk's
    assert logged_losses(root / "auto") == pytest.approx(logged_losses(root / "whole"), rel=1e-5)


def test_fixed_micro_batches_under_the_loss_scaler_train_the_whole_batchs_weights(runs):
    """fp16 rounds each micro-batch's own way: 2.4e-4 apart after 3 steps (as far as the whole
    batch in fp16 is from fp32); chunks back-propagated without the loss scale: 0.2 apart."""
    root, summaries, _ = runs
    summary = summaries["fixed-fp16"]
    assert summary["micro_batch_size"] == 4 and summary["precision"]["skipped_steps"] == 0
    assert summary["plugins"]["grad_accum"]["micro_batch_size"] == 4
    whole = final_weights(root / "whole-fp16")
    fixed = final_weights(root / "fixed-fp16")
    assert max(float((fixed[k] - w).norm() / w.norm()) for k, w in whole.items()) < 2e-3


def test_a_resume_keeps_the_size_found_and_does_not_search_again(runs):
    root, summaries, found = runs
    (checkpoint,) = (root / "auto" / "checkpoints").glob("*.ckpt")
    saved = torch.load(checkpoint, map_location="cpu", weights_only=False)
    assert saved["tuneup"]["grad_accum"] == {"micro_batch_size": 4, "oom_retries": 2}
    resumed = summaries["resumed"]
    assert resumed["status"] == "ok" and resumed["steps"] == STEPS + 1
    assert found["resumed"].raised == 0  # no batch above 4 was tried again
    assert resumed["micro_batch_size"] == 4 and resumed["micro_batch_oom_retries"] == 2


def test_ranks_agree_on_the_size_under_ddp_and_fsdp(tmp_path, runs):
    """Two processes (gloo): under DDP only rank 1 runs out of memory above 4 samples of its 8,
    and rank 0 halves with it (its summary); the weights are those of one process on the
    global batch of 16. Under FSDP2 both ranks do, and the run goes on with 4."""
    site = make_distribution(
        tmp_path / "site",
        "tuneup-oom",
        {"oom_above": ENTRY_POINT_MODULE},
        {"oom_above": "oom_above:Plugin"},
    )
    path = os.pathsep.join([str(site), *sys.path])
    common = [
        *MLP,
        "trainer.devices=2",
        "data.batch_size=8",
        f"trainer.max_steps={STEPS}",
        "grad_accum.micro_batch_size=auto",
    ]
    for strategy, rank in (("ddp", "1"), ("fsdp", None)):
        env = {"PYTHONPATH": path, "OOM_ABOVE": "4", **({"OOM_RANK": rank} if rank else {})}
        run_dir = tmp_path / strategy
        done = run_cli(
            *common,
            f"strategy={strategy}",
            f"hydra.run.dir={run_dir}",
            env=env,
            cwd=tmp_path,
            tiny=False,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["status"] == "ok" and summary["world_size"] == 2
        assert summary["samples"] == STEPS * 16  # both ranks' samples
        assert summary["micro_batch_size"] == 4 and summary["micro_batch_oom_retries"] == 1
    whole = final_weights(runs[0] / "whole")
    assert largest_difference(final_weights(tmp_path / "ddp"), whole) < 1e-6


# -- settings and pieces -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, []),
        ("auto", []),
        (4, []),
        (5, ["grad_accum.micro_batch_size=5 is not allowed: expected null (the whole batch at "
             "once), 'auto' (halved on out-of-memory errors) or a divisor of "
             "data.batch_size=16 (1, 2, 4, 8, 16)"]),
        (0, ["grad_accum.micro_batch_size=0 is not allowed"]),
        ("half", ["grad_accum.micro_batch_size='half' is not allowed"]),
    ],
)  # fmt: skip
def test_the_size_is_null_auto_or_a_divisor_of_the_batch(value, expected):
    found = micro_batch_problems(value, 16)
    assert len(found) == len(expected)
    assert all(f.startswith(e) for f, e in zip(found, expected, strict=True))


def test_a_bad_size_stops_the_run_before_training(tmp_path):
    with pytest.raises(TuneupError, match=r"grad_accum.micro_batch_size=3 is not allowed"):
        run(tmp_path / "bad", "grad_accum.micro_batch_size=3")


def test_batches_split_along_the_samples():
    batch = {"x": torch.arange(10).view(5, 2), "y": (torch.arange(5), "label"), "n": 7}
    assert batch_length(batch) == 5
    part = split(batch, 1, 3)
    assert part["x"].tolist() == [[2, 3], [4, 5]] and part["y"][0].tolist() == [1, 2]
    assert part["y"][1] == "label" and part["n"] == 7
