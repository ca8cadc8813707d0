"""The checkpoint plugin: which files a run writes, what is in them, safe settings, divergence."""

from __future__ import annotations

import math

import pytest
import torch
from omegaconf import DictConfig, ListConfig

from tuneup import TuneupError, hookimpl
from tuneup.trainer.state.checkpoints import BEST, checkpoint_name
from tuneup.trainer.state.divergence import Diverged

#: A model without BatchNorm and small: each run takes about a second.
MLP = [
    "model=mlp",
    "model.hidden=[16]",
    "data.train_samples=128",
    "data.val_samples=32",
    "data.batch_size=32",
    "trainer.enable_progress_bar=false",
]


def names(run_dir):
    return sorted(p.name for p in (run_dir / "checkpoints").glob("*.ckpt"))


def plain(value) -> bool:
    """Only tensors and plain Python containers and scalars, all the way down."""
    if isinstance(value, (DictConfig, ListConfig)):
        return False
    if isinstance(value, dict):
        return all(isinstance(k, (str, int)) and plain(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return all(plain(v) for v in value)
    return value is None or isinstance(value, (bool, int, float, str, torch.Tensor))


def test_epoch_end_checkpoints_keep_the_last_k_and_hold_only_plain_data(train):
    summary, run_dir = train(*MLP, "trainer.max_epochs=4", "checkpoint.keep_last=2", tiny=False)
    assert names(run_dir) == [checkpoint_name(2, 12), checkpoint_name(3, 16)]
    state = torch.load(run_dir / "checkpoints" / checkpoint_name(3, 16), weights_only=True)
    for key in (
        "state_dict",
        "loops",
        "optimizer_states",
        "lr_schedulers",
        "callbacks",
        "tuneup",
        "tuneup_rng",
        "tuneup_run",
        "tuneup_data_order",
    ):
        assert key in state, key
    assert plain(state)
    assert state["tuneup_data_order"]["epoch"] == 4  # a finished epoch: the next one's start
    assert summary["checkpoints"]["written"] == 4 and summary["checkpoints"]["last"].endswith(
        checkpoint_name(3, 16)
    )


def test_step_checkpoints_and_the_final_step_mid_epoch(train):
    _, run_dir = train(
        *MLP,
        "trainer.max_steps=5",
        "checkpoint.every_n_steps=2",
        "checkpoint.keep_last=null",
        tiny=False,
    )
    # 4 batches per epoch; step 4 is also the end of epoch 0 (saved once); 5 is the final step
    assert names(run_dir) == [checkpoint_name(e, s) for e, s in ((0, 2), (0, 4), (1, 5))]


def test_fp16_loss_scaler_state_is_saved_and_loads_weights_only(train):
    _, run_dir = train(*MLP, "precision=fp16", "trainer.max_steps=2", tiny=False)
    state = torch.load(run_dir / "checkpoints" / checkpoint_name(0, 2), weights_only=True)
    (scaler,) = [v for k, v in state.items() if k.endswith("MixedPrecision")]  # by class name
    assert scaler["scale"] > 0 and plain(state)


def test_best_checkpoint_by_a_monitored_metric(train):
    summary, run_dir = train(
        *MLP,
        "trainer.max_epochs=3",
        "checkpoint.monitor=val/loss",
        "checkpoint.mode=min",
        tiny=False,
    )
    best = torch.load(run_dir / "checkpoints" / BEST, weights_only=True)
    assert best["callbacks"]["tuneup_checkpoint"]["best"] == summary["checkpoints"]["best"]
    assert math.isclose(summary["checkpoints"]["best"], summary["val"]["loss"], rel_tol=0.5)


def test_checkpoint_off_writes_nothing(train):
    summary, run_dir = train(*MLP, "trainer.max_epochs=1", "checkpoint=off", tiny=False)
    assert not (run_dir / "checkpoints").exists() and "checkpoints" not in summary


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("+checkpoint.every_n_step=5", "checkpoint.every_n_step is not a checkpoint setting"),
        ("checkpoint.keep_last=0", "checkpoint.keep_last=0 is not allowed: expected an integer"),
        ("checkpoint.every_n_minutes=-1", "checkpoint.every_n_minutes=-1 is not allowed"),
        ("checkpoint.mode=up", "checkpoint.mode='up' is not allowed: expected one of 'max', 'min'"),
        ("+trainer.enable_checkpointing=false", "choose checkpoint=off"),
    ],
)
def test_bad_settings_are_named(train, override, expected):
    with pytest.raises(TuneupError, match="problem") as info:
        train(*MLP, override, tiny=False)
    assert expected in str(info.value)


def test_a_fresh_run_in_a_directory_with_checkpoints_is_refused(train):
    train(*MLP, "trainer.max_steps=1", tiny=False)
    with pytest.raises(TuneupError, match=r"resume=null .* already holds 1 checkpoint"):
        train(*MLP, "trainer.max_steps=1", tiny=False)


def test_a_missing_resume_path_is_an_error(train, tmp_path):
    with pytest.raises(TuneupError, match="no such file"):
        train(*MLP, f"resume={tmp_path}/nope.ckpt", tiny=False)


def test_a_nan_loss_stops_the_run_naming_the_step(train, tmp_path):
    with pytest.raises(Diverged, match=r"the loss was nan in step 2 \(epoch 0, .*rank 0"):
        train(*MLP, "optimizer.lr=1e20", "checkpoint.every_n_steps=1", tiny=False)
    (path,) = (tmp_path / "run" / "checkpoints").glob("*.ckpt")  # step 1, before the NaN
    weights = torch.load(path, weights_only=True)["state_dict"]
    assert path.name == checkpoint_name(0, 1) and all(t.isfinite().all() for t in weights.values())


class NanData:
    """Puts a NaN into the input of training micro-batch ``at`` (1-based), as bad data would."""

    def __init__(self, at: int) -> None:
        self.at, self.seen = at, 0

    @hookimpl
    def transform_batch(self, batch):
        x, y = batch
        if torch.is_grad_enabled():  # training batches only
            self.seen += 1
            if self.seen == self.at:
                x = x.clone()
                x.view(-1)[5] = math.nan
        return x, y


def test_nan_in_the_data_is_named_as_the_data_not_divergence(train, add_plugin):
    add_plugin(NanData(at=3))
    with pytest.raises(Diverged) as raised:
        train(*MLP, tiny=False)
    text = str(raised.value)
    assert text.startswith(
        "the data holds NaN or inf: the loss was nan in step 3 (epoch 0, "
        "batch 2 of the epoch) on rank 0, and that batch held non-finite "
        "values in batch[0] (1 of 98304 values)."
    )
    assert "learning rate" not in text and "fp16" not in text


class Poison:
    """Makes a weight infinite right after optimizer step ``step``, before it could be saved."""

    def __init__(self, step: int) -> None:
        self.step = step

    @hookimpl
    def on_train_batch_end(self, trainer, module):
        if trainer.global_step == self.step:
            with torch.no_grad():
                next(module.parameters())[0, 0] = math.inf


def test_nonfinite_weights_never_overwrite_the_last_good_checkpoint(train, tmp_path, add_plugin):
    train(*MLP, "trainer.max_steps=3", "checkpoint.every_n_steps=1", tiny=False)
    before = {p.name: p.read_bytes() for p in (tmp_path / "run" / "checkpoints").glob("*.ckpt")}
    add_plugin(Poison(step=4))
    with pytest.raises(Diverged, match=r"not saving step 4: weights model.*hold NaN or inf"):
        train(*MLP, "trainer.max_steps=6", "checkpoint.every_n_steps=1", "resume=auto", tiny=False)
    after = {p.name: p.read_bytes() for p in (tmp_path / "run" / "checkpoints").glob("*.ckpt")}
    assert after == before  # no step-4 file, the others untouched
