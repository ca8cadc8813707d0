"""Resuming with changed settings: every changed key is listed, and each either takes effect
as asked (and the warning says so) or is refused with what to do instead.

One short run writes a checkpoint at step 5 (mid-epoch); each test resumes a copy of it.
"""

from __future__ import annotations

import logging
import math
import shutil

import pytest
import torch

import tuneup
from tests.conftest import compose_config
from tuneup import TuneupError, hookimpl
from tuneup.trainer.state.checkpoint_read import load
from tuneup.trainer.state.checkpoints import checkpoint_name

#: 10 micro-batches per epoch, 10 steps; sgd (lr 0.05) and cosine unless a test says otherwise.
RUN = [
    "model=mlp",
    "model.hidden=[8]",
    "data.image_size=8",
    "data.train_samples=40",
    "data.val_samples=8",
    "data.batch_size=4",
    "trainer.max_epochs=3",
    "trainer.max_steps=10",
    "checkpoint.every_n_steps=5",
    "checkpoint.keep_last=null",
    "trainer.enable_progress_bar=false",
]
STEP = 5


class LearningRates:
    """The learning rate of each optimizer step."""

    def __init__(self) -> None:
        self.lrs: list[float] = []

    @hookimpl
    def on_before_optimizer_step(self, optimizer):
        self.lrs.append(optimizer.param_groups[0]["lr"])


class StartingWeights:
    """The model's weights when training starts."""

    weights: dict | None = None

    @hookimpl
    def on_fit_start(self, module):
        self.weights = {k: v.detach().clone() for k, v in module.state_dict().items()}


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    """The step-5 checkpoint of the module's one run of RUN (read by the tests, never changed)."""
    run_dir = tmp_path_factory.mktemp("first") / "run"
    tuneup.run(compose_config(RUN, tiny=False), run_dir=run_dir)
    return run_dir / "checkpoints" / checkpoint_name(0, STEP)


@pytest.fixture
def checkpoint(first_run):
    """``checkpoint()``: the step-5 checkpoint of the run of RUN."""
    return lambda: first_run


@pytest.fixture
def resume(train, tmp_path):
    """``resume(path, *overrides)``: resume=auto from a copy of ``path`` in a new directory."""

    def _resume(path, *overrides):
        run_dir = tmp_path / "resumed"
        (run_dir / "checkpoints").mkdir(parents=True)
        shutil.copy(path, run_dir / "checkpoints" / path.name)
        summary, _ = train(*RUN, "resume=auto", *overrides, tiny=False, run_dir=run_dir)
        return summary

    return _resume


def load_summary(run_dir) -> dict:
    import json

    return json.loads((run_dir / "summary.json").read_text())


def changed_lines(caplog) -> str:
    return "\n".join(r.getMessage() for r in caplog.records if "changed settings" in r.getMessage())


# -- take effect ------------------------------------------------------------------------------


def test_a_new_learning_rate_takes_effect_from_the_resumed_step(
    checkpoint, resume, train, tmp_path, add_plugin, caplog
):
    """lr 0.05 -> 0.5 at step 5: steps 5..9 run at the 0.5 run's cosine learning rates
    (Lightning alone restored 0.05 and said nothing)."""
    caplog.set_level(logging.WARNING)
    path = checkpoint()
    spy = add_plugin(LearningRates())
    resume(path, "optimizer.lr=0.5")
    resumed = spy.lrs[:]
    spy.lrs.clear()
    train(*RUN, "optimizer.lr=0.5", tiny=False, run_dir=tmp_path / "at-0.5")
    assert resumed == pytest.approx(spy.lrs[STEP:], rel=1e-12)
    assert resumed[0] == pytest.approx(0.5 * 0.5 * (1 + math.cos(math.pi * STEP / 10)))
    assert "optimizer.lr: 0.05 -> 0.5: takes effect from step 5" in changed_lines(caplog)


def test_a_new_schedule_takes_effect_at_the_resumed_step(checkpoint, resume, add_plugin, caplog):
    caplog.set_level(logging.WARNING)
    path = checkpoint()  # cosine
    spy = add_plugin(LearningRates())
    resume(path, "scheduler=constant")
    assert spy.lrs == [0.05] * (10 - STEP)  # not one more step of cosine first
    lines = changed_lines(caplog)
    assert "scheduler.name: 'cosine' -> 'constant': takes effect from step 5" in lines
    assert "scheduler.min_lr_ratio: 0.0 -> '(unset)'" in lines  # constant.yaml has no such key


def test_every_changed_key_is_listed_with_what_it_does(checkpoint, resume, caplog):
    caplog.set_level(logging.WARNING)
    path = checkpoint()
    summary = resume(
        path,
        "optimizer.momentum=0.5",
        "scheduler.warmup_steps=2",
        "seed=7",
        "checkpoint.every_n_steps=4",
        "trainer.max_steps=12",
    )
    assert summary["status"] == "ok" and summary["steps"] == 12
    lines = changed_lines(caplog)
    for expected in (
        "optimizer.momentum: 0.9 -> 0.5: takes effect from step 5",
        "scheduler.warmup_steps: 0 -> 2: takes effect from step 5",
        "seed: 0 -> 7: no effect",
        "checkpoint.every_n_steps: 5 -> 4: takes effect",
        "trainer.max_steps: 10 -> 12: takes effect from step 5",
    ):
        assert expected in lines
    assert len([line for line in lines.splitlines() if line.startswith("  - ")]) == 5


# -- refused -------------------------------------------------------------------------------


def test_another_optimizer_is_refused_naming_the_key_and_the_ways_out(checkpoint, resume, tmp_path):
    """Lightning loaded the SGD state into AdamW and failed with KeyError: 'step'."""
    path = checkpoint()
    with pytest.raises(TuneupError, match="cannot resume") as info:
        resume(path, "optimizer=adamw")
    message = str(info.value)
    assert "optimizer.name: 'sgd' -> 'adamw': the saved optimizer state" in message
    assert not (tmp_path / "resumed" / "summary.json").exists()  # refused: the run untouched
    assert "resume_weights_only=true" in message and "resume with the old value" in message
    assert "(also changed: optimizer.betas, optimizer.eps, optimizer.lr" in message


def test_a_changed_model_is_refused_naming_the_key_and_the_shapes(checkpoint, resume):
    """Lightning failed with a raw RuntimeError from load_state_dict."""
    path = checkpoint()
    with pytest.raises(TuneupError, match="cannot resume") as info:
        resume(path, "model.hidden=[16]")
    message = str(info.value)
    assert "model.hidden: [8] -> [16]: the checkpoint's weights do not fit" in message
    assert "[8, 192] in the checkpoint, [16, 192] now" in message
    assert "start fresh in another directory" in message


def test_an_optimizer_of_another_class_is_refused_even_without_a_recorded_config(
    checkpoint, resume, tmp_path
):
    """A checkpoint that records no config (an older tuneup's): the optimizer's class, checked
    before Lightning loads its state, still stops it."""
    path = checkpoint()
    state = torch.load(path, weights_only=True)
    del state["tuneup_run"]["config"]
    older = tmp_path / path.name
    torch.save(state, older)
    with pytest.raises(TuneupError, match=r"optimizer is SGD, this run's AdamW.*weights_only"):
        resume(older, "optimizer=adamw")
    assert not (tmp_path / "resumed" / "summary.json").exists()  # refused as fit started


# -- weights only ------------------------------------------------------------------------------


def test_weights_only_starts_a_new_run_from_the_checkpoints_weights(
    checkpoint, train, tmp_path, add_plugin
):
    path = checkpoint()
    probe = add_plugin(StartingWeights())
    summary, _ = train(
        *RUN,
        f"resume={path}",
        "resume_weights_only=true",
        "optimizer=adamw",
        tiny=False,
        run_dir=tmp_path / "new",
    )
    assert summary["status"] == "ok" and summary["resumed_weights_only"] is True
    assert summary["steps"] == 10  # a new run: its own 10 steps, from step 0
    saved = load(path)["state_dict"]
    assert probe.weights.keys() == saved.keys()
    assert all(torch.equal(probe.weights[k], saved[k]) for k in saved)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["model.hidden=[16]"], r"weights of .* do not fit the model built now .*\[16, 192\]"),
        (["resume=auto"], r"resume_weights_only=true needs resume=<path"),
        (["resume_weights_only=maybe"], r"resume_weights_only='maybe' is not allowed"),
    ],
)
def test_weights_only_refusals(checkpoint, train, tmp_path, overrides, expected):
    path = checkpoint()
    with pytest.raises(TuneupError, match=expected):
        train(
            *RUN,
            f"resume={path}",
            "resume_weights_only=true",
            *overrides,
            tiny=False,
            run_dir=tmp_path / "new",
        )


def test_weights_only_needs_a_directory_without_checkpoints(checkpoint, train, tmp_path):
    path = tmp_path / "first" / "checkpoints" / checkpoint().name  # a run's own directory
    path.parent.mkdir(parents=True)
    shutil.copy(checkpoint(), path)
    with pytest.raises(TuneupError, match=r"already holds .* continue that run with resume=auto"):
        train(
            *RUN,
            f"resume={path}",
            "resume_weights_only=true",
            tiny=False,
            run_dir=tmp_path / "first",
        )
