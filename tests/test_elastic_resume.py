"""Elastic resume: a checkpoint cut mid-epoch goes on on another number of processes, batch
size or accumulation. The rest of the epoch is the same global sequence, dealt anew; with
the same global batch the run ends as the uninterrupted one, with another each remaining
sample is seen once, and the warning says which of the two happened.

The sampler's arithmetic is checked directly (4 -> 2, 2 -> 1, 1 -> 2, odd sizes with
padding, a 2x2 mesh -> FSDP x2); one real 2-process run (DDP, gloo) writes a checkpoint at
step 3 of 8 (24 of the epoch's 64 samples), resumed in this process on one.
"""

from __future__ import annotations

import csv
import json
import logging
import os
import shutil
import sys

import pytest
import torch

from tests.conftest import compose_config, run_cli
from tests.plugin_dists import make_distribution
from tuneup import hookimpl
from tuneup.trainer.state import changes
from tuneup.trainer.state.checkpoint_read import load
from tuneup.trainer.state.checkpoints import checkpoint_name, list_checkpoints
from tuneup.trainer.state.data_order import ResumableSampler

#: model=mlp (no BatchNorm: a step's gradient does not depend on how its batch is split).
RUN = [
    "model=mlp",
    "model.hidden=[8]",
    "data.image_size=8",
    "data.train_samples=64",
    "data.val_samples=8",
    "trainer.max_epochs=1",
    "trainer.accelerator=cpu",
    "trainer.enable_progress_bar=false",
    "checkpoint.every_n_steps=3",
    "checkpoint.keep_last=null",
]
STEP, SEEN = 3, 24  # the checkpoint resumed: step 3 of 8, 24 samples into epoch 0


# -- the sampler ------------------------------------------------------------------------------


def dealt(shards: list[list[int]]) -> list[int]:
    """The global sequence of shards that advance in lockstep: shard i % n's (i // n)-th."""
    return [shard[i] for i in range(len(shards[0])) for shard in shards]


def rest_after(state: dict, size: int, seed: int, shards: int) -> list[list[int]]:
    """Each of ``shards`` new samplers' indices, resumed from ``state``."""
    found = []
    for rank in range(shards):
        sampler = ResumableSampler(size, seed, rank=rank, num_replicas=shards)
        sampler.load_state_dict(state)
        found.append(list(sampler))
    return found


@pytest.mark.parametrize(
    ("size", "old", "taken", "new"),
    [(40, 4, 3, 2), (40, 2, 5, 1), (40, 1, 7, 2), (37, 4, 2, 2), (37, 2, 3, 3), (10, 3, 1, 4)],
)
def test_the_rest_of_an_epoch_is_the_same_global_sequence_resharded(size, old, taken, new):
    order = ResumableSampler(size, seed=7).permutation(0)
    before = [ResumableSampler(size, 7, rank=r, num_replicas=old) for r in range(old)]
    for sampler in before:
        sampler.advance(taken)
    trained = dealt([s.order(0)[:taken] for s in before])
    rest = rest_after(before[0].state_dict(), size, 7, new)
    assert len({len(shard) for shard in rest}) == 1  # the shards stay in lockstep
    sequence, left = dealt(rest), size - len(trained)
    assert trained == order[: old * taken]
    assert sequence[:left] == order[old * taken :]  # the same global sequence, resharded
    assert len(sequence) - left < new  # padding only at the end, less than one per shard
    assert sorted(trained + sequence[:left]) == list(range(size))  # every sample once


def test_a_resharded_rest_reshards_again():
    """4 shards take 2 each, 2 take 3 each, then 3 shards finish epoch 0."""
    order = ResumableSampler(37, seed=1).permutation(0)
    first = ResumableSampler(37, 1, num_replicas=4)
    first.advance(2)
    second = ResumableSampler(37, 1, num_replicas=2)
    second.load_state_dict(first.state_dict())
    second.advance(3)
    state = second.state_dict()
    assert (state["start"], state["position"]) == (8, 3)
    assert dealt(rest_after(state, 37, 1, 3))[: 37 - 14] == order[14:]


def test_a_2x2_mesh_resumed_as_fsdp_x2_keeps_its_two_data_shards():
    """4 processes, tensor parallel groups of 2: 2 data shards, as FSDP x2 has; the sampler
    state goes on unchanged and the warning says the data order is unchanged."""
    before = ResumableSampler(40, 3, rank=1, num_replicas=2)
    before.advance(8)
    after = rest_after(before.state_dict(), 40, 3, 2)[1]
    assert after == before.order(0)[8:]
    saved = {"config": {}, "world_size": 4, "data_shards": 2, "data.batch_size": 8, "grad_accum": 1}
    current = {**saved, "world_size": 2}
    (change,) = changes.review(context(saved, current, position=8, size=40))
    assert change.key == "world size" and "the data order is unchanged (2 data shard(s)" in str(
        change
    )


# -- the warning -------------------------------------------------------------------------------


def context(saved: dict, current: dict, position: int, size: int) -> changes.Context:
    shards = saved["data_shards"]
    order = {
        "epoch": 0,
        "start": 0,
        "position": position,
        "seed": 0,
        "size": size,
        "num_replicas": shards,
        "batch_size": saved["data.batch_size"],
    }
    return changes.Context(
        step=2,
        position=position,
        saved=saved,
        current=current,
        weights_problem=None,
        owns_optimizer=True,
        order=order,
    )


def facts(world: int, batch: int, accumulate: int = 1) -> dict:
    config = {"data.batch_size": batch, "grad_accum.steps": accumulate}
    return {
        "config": config,
        "world_size": world,
        "data_shards": world,
        "data.batch_size": batch,
        "grad_accum": accumulate,
    }


def test_the_warning_says_whether_the_steps_are_the_same_or_the_rest_is_seen_once():
    same = changes.review(context(facts(4, 4), facts(2, 8), position=8, size=64))
    lines = "\n".join(map(str, same))
    assert "global batch: 16 -> 16: same global batch: resumes the same sequence of steps" in lines
    assert "epoch 0 goes on from its sample 32 over 2 data shard(s)" in lines
    assert not any(c.refused for c in same)

    other = changes.review(context(facts(1, 4), facts(2, 4, 3), position=20, size=64))
    (line,) = [str(c) for c in other if c.key == "global batch"]
    assert line == (
        "global batch: 4 -> 24: global batch changed from 4 to 24: of the remaining 44 samples "
        "of epoch 0, 40 are each seen once, in the same order, in steps of 24; the last 4 of the "
        "epoch's order are left out (each of the 2 data shard(s) trains whole batches of 4 only, "
        "as every epoch in this layout does)"
    )
    assert "grad_accum.steps: 1 -> 3: takes effect from step 2: 3 micro-batch(es)" in "\n".join(
        map(str, other)
    )

    # 2 x 6 -> 12 x 1 after 36 of 64: the 28 left padded to 36, each shard's 3 all trained
    padded = changes.review(context(facts(2, 6), facts(12, 1), position=18, size=64))
    (line,) = [str(c) for c in padded if c.key == "global batch"]
    assert line.endswith(
        "same global batch: resumes the same sequence of steps (epoch 0 goes on "
        "from its sample 36 over 12 data shard(s)); at the epoch's end: 8 "
        "sample(s) from the epoch's start are trained again, to fill the last "
        "batches of the 12 data shard(s)"
    )
    shards = rest_after(
        {"epoch": 0, "start": 0, "position": 18, "seed": 0, "size": 64, "num_replicas": 2},
        64,
        0,
        12,
    )
    assert sum(map(len, shards)) - 28 == 8

    # 2 x 6 -> 3 x 5 after 36 of 60 (inside a step of 15 on the new grid): whole steps of 15,
    # the first one too (every micro-batch is whole; no accumulation window to fill)
    (line,) = [
        str(c)
        for c in changes.review(context(facts(2, 6), facts(3, 5), position=18, size=60))
        if c.key == "global batch"
    ]
    assert line == (
        "global batch: 12 -> 15: global batch changed from 12 to 15: of the remaining 24 samples "
        "of epoch 0, 15 are each seen once, in the same order, in steps of 15; the last 9 of the "
        "epoch's order are left out (each of the 3 data shard(s) trains whole batches of 5 only, "
        "as every epoch in this layout does)"
    )


# -- real runs: 2 processes -> 1 -------------------------------------------------------------


#: A plugin that records, per process, the index of every training sample the loader reads
#: (the training loaders read only the batches they hand to the loop: full ones, drop_last),
#: with SEEN_DIR set; with STEP_DIR set, each micro-batch's samples and the steps done after
#: it; and, with LOSS_DIR set, each process's own loss at every step.
RECORDER = """
import os
from tuneup import hookimpl


class Recorded:
    def __init__(self, dataset, folder):
        self.dataset, self.folder = dataset, folder

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, index):
        with open(os.path.join(self.folder, f"{os.getpid()}.txt"), "a") as f:
            f.write(f"{index}\\n")
        return self.dataset[index]


class Plugin:
    @hookimpl
    def configure_dataloader(self, kwargs):
        folder = os.environ.get("SEEN_DIR")
        if folder and "sampler" in kwargs:  # the training loader
            kwargs["dataset"] = Recorded(kwargs["dataset"], folder)

    @hookimpl
    def on_train_batch_end(self, trainer, outputs, batch):
        folder = os.environ.get("STEP_DIR")
        if folder:  # the samples of each micro-batch, by the optimizer steps done after it
            with open(os.path.join(folder, f"{trainer.global_rank}.txt"), "a") as f:
                f.write(f"{trainer.global_step} {len(batch[0])}\\n")
        folder = os.environ.get("LOSS_DIR")
        if folder:
            loss = outputs["loss"] if isinstance(outputs, dict) else outputs
            with open(os.path.join(folder, f"{trainer.global_rank}.txt"), "a") as f:
                f.write(f"{trainer.global_step} {float(loss)!r}\\n")
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    return make_distribution(
        tmp_path_factory.mktemp("site"),
        "tuneup-recorder",
        {"recorder": RECORDER},
        {"recorder": "recorder:Plugin"},
    )


def with_recorder(site, **folders) -> dict:
    """The environment of a run that loads the recorder, recording into ``folders``."""
    path = os.pathsep.join([str(site), *sys.path])
    return {"OMP_NUM_THREADS": "1", "PYTHONPATH": path, **{k: str(v) for k, v in folders.items()}}


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory, site):
    """The uninterrupted run: 2 processes (DDP), batches of 4 each, a global batch of 8; each
    process's loss at every step recorded in ``losses/`` beside the run directory."""
    run_dir = tmp_path_factory.mktemp("ddp")
    (run_dir / "losses").mkdir()
    env = with_recorder(site, LOSS_DIR=run_dir / "losses")
    result = run_cli(
        *RUN,
        "strategy=ddp",
        "trainer.devices=2",
        "data.batch_size=4",
        f"hydra.run.dir={run_dir}",
        tiny=False,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir


def test_the_logged_training_loss_is_the_mean_over_the_processes(two_processes):
    """metrics.csv's train/loss (every step: the run logs each of its 8), the summary's
    train_loss and loss_curve: the global batch's loss, the mean of the two processes' own
    losses (recorded by each), not rank 0's."""
    own = {}  # rank -> {step: loss}
    for path in (two_processes / "losses").iterdir():
        pairs = [line.split() for line in path.read_text().splitlines()]
        own[int(path.stem)] = {int(step): float(loss) for step, loss in pairs}
    assert sorted(own) == [0, 1] and sorted(own[0]) == sorted(own[1]) == list(range(1, 9))
    mean = {step: (own[0][step] + own[1][step]) / 2 for step in own[0]}
    assert max(abs(own[0][s] - own[1][s]) for s in mean) > 1e-3  # rank 0's would not do
    with open(two_processes / "metrics.csv") as f:
        rows = [row for row in csv.DictReader(f) if row.get("train/loss")]
    logged = {int(row["step"]): float(row["train/loss"]) for row in rows}  # after N steps
    assert sorted(logged) == list(range(1, 9))
    assert max(abs(logged[s] - mean[s]) for s in mean) < 1e-6
    summary = json.loads((two_processes / "summary.json").read_text())
    assert summary["train_loss"] == pytest.approx(mean[8], abs=1e-6)
    curve = summary["loss_curve"]  # 16 points at most: a bucket per micro-batch here
    assert curve["samples"] == [8 * s for s in range(1, 9)]
    assert curve["loss"] == pytest.approx([mean[s] for s in range(1, 9)], rel=1e-5)


@pytest.fixture
def resume_on_one(two_processes, train, tmp_path, caplog):
    """``resume_on_one(*overrides)``: step 3 of the 2-process run, resumed on one process;
    returns (summary, the warning's text)."""
    caplog.set_level(logging.WARNING)

    def _resume(*overrides):
        run_dir = tmp_path / "one"
        (run_dir / "checkpoints").mkdir(parents=True)
        name = checkpoint_name(0, STEP)
        shutil.copy(two_processes / "checkpoints" / name, run_dir / "checkpoints" / name)
        summary, _ = train(*RUN, "resume=auto", *overrides, tiny=False, run_dir=run_dir)
        return summary, caplog.text

    return _resume


def final_weights(run_dir) -> dict[str, torch.Tensor]:
    return load(list_checkpoints(run_dir / "checkpoints")[0])["state_dict"]


def test_same_global_batch_on_one_process_ends_as_the_uninterrupted_run(
    two_processes, resume_on_one, tmp_path
):
    summary, said = resume_on_one("data.batch_size=8")
    assert summary["status"] == "ok" and summary["steps"] == 8
    assert summary["samples"] == 64 and "short_of_limits" not in summary
    assert "world size: 2 -> 1" in said
    assert "same global batch: resumes the same sequence of steps" in said
    got, expected = final_weights(tmp_path / "one"), final_weights(two_processes)
    assert max(float((got[k] - v).norm() / v.norm()) for k, v in expected.items()) < 1e-5


class Steps:
    """The micro-batches of each optimizer step, and the steps at which the fit validated."""

    def __init__(self) -> None:
        self.windows: list[int] = []
        self.validated: list[int] = []
        self.micro_batches = 0

    @hookimpl
    def on_after_backward(self):
        self.micro_batches += 1

    @hookimpl
    def on_before_optimizer_step(self):
        self.windows.append(self.micro_batches)
        self.micro_batches = 0

    @hookimpl
    def on_validation_end(self, trainer):
        if trainer.state.fn == "fit":
            self.validated.append(trainer.global_step)


@pytest.mark.parametrize(
    ("batch", "k", "windows", "said"),
    [
        # 16: the one-process epoch's grid has a step end at sample 32: a first step of 8
        (4, 4, [2, 4, 4], "in steps of 16; the first step takes 8, to where a step of 16 ends"),
        # 6: 10 steps where the epoch's 11 at the new batch would ask for 11 in all
        (2, 3, [3, 3, 3, 3, 3, 3, 2], "in steps of 6\n"),
    ],
    ids=["16, a shorter first step", "6, more steps than the epoch has at 8"],
)
def test_another_global_batch_sees_each_remaining_sample_once_and_says_so(
    resume_on_one, add_plugin, monkeypatch, batch, k, windows, said
):
    """From a global batch of 8: the 40 samples left, once each, in order; the steps fall on
    the one-process epoch's grid; the run is not taken for short of its one epoch."""
    yielded: list[int] = []
    iterate = ResumableSampler.__iter__

    def recorded(sampler):
        indices = list(iterate(sampler))
        yielded.extend(indices)
        return iter(indices)

    monkeypatch.setattr(ResumableSampler, "__iter__", recorded)
    steps = add_plugin(Steps())
    summary, text = resume_on_one(f"data.batch_size={batch}", f"grad_accum.steps={k}")
    seed = compose_config(RUN, tiny=False).seed
    assert yielded == ResumableSampler(64, seed).permutation(0)[SEEN:]
    assert steps.windows == windows
    assert steps.validated == [STEP + len(windows)]  # at the epoch's end, once
    assert summary["steps"] == STEP + len(windows) and summary["samples"] == 64
    assert "short_of_limits" not in summary
    assert (
        f"global batch changed from 8 to {batch * k}: the remaining 40 samples of epoch 0 are "
        f"each seen once, in the same order, {said}"
    ) in text


# -- real runs: 2 processes -> 2 processes at another batch size -------------------------------


def test_another_batch_on_processes_trains_what_the_warning_says_and_reaches_its_end(
    two_processes, site, tmp_path
):
    """Step 3 of the 2-process run (batches of 4, 24 samples) resumed on 2 processes with
    batches of 7: a global batch of 14, whose grid of the epoch has a step from sample 14 to
    28; the first step is still a whole 14 (no accumulation window to fill: every micro-batch
    is whole). Each shard has 20 of the 40 samples left and trains 2 whole batches of 7; the
    last 6 of each shard's share, the last 12 of the epoch's order, are left out, as the
    warning says, and the run ends at the epoch's end (step 5) without being taken for short
    of it."""
    run_dir, seen, steps = tmp_path / "two-at-7", tmp_path / "seen", tmp_path / "steps"
    (run_dir / "checkpoints").mkdir(parents=True)
    seen.mkdir()
    steps.mkdir()
    name = checkpoint_name(0, STEP)
    shutil.copy(two_processes / "checkpoints" / name, run_dir / "checkpoints" / name)
    env = with_recorder(site, SEEN_DIR=seen, STEP_DIR=steps)
    result = run_cli(
        *RUN,
        "strategy=ddp",
        "trainer.devices=2",
        "data.batch_size=7",
        "resume=auto",
        f"hydra.run.dir={run_dir}",
        tiny=False,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    trained = [int(line) for f in seen.iterdir() for line in f.read_text().split()]
    order = ResumableSampler(64, compose_config(RUN, tiny=False).seed).permutation(0)
    assert sorted(trained) == sorted(order[SEEN : SEEN + 28])  # each once, the order's next 28
    left_out = 64 - SEEN - len(trained)
    assert left_out == 12
    per_step: dict[int, int] = {}  # the samples of each optimizer step, over both processes
    for path in steps.iterdir():
        for step, samples in (map(int, line.split()) for line in path.read_text().splitlines()):
            per_step[step] = per_step.get(step, 0) + samples
    assert per_step == {STEP + 1: 14, STEP + 2: 14}  # the first step whole, as the docs say
    said = " ".join((result.stdout + result.stderr).split())
    assert (
        "global batch changed from 8 to 14: of the remaining 40 samples of epoch 0, 28 are each "
        "seen once, in the same order, in steps of 14; the last 12 of the epoch's order are left "
        "out (each of the 2 data shard(s) trains whole batches of 7 only"
    ) in said
    assert "the first step takes" not in said
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["steps"] == STEP + 2
    assert summary["samples"] == SEEN + 28 and "short_of_limits" not in summary
