"""``mode=test`` and ``mode=predict`` with ``resume=<checkpoint>`` (issue 43 point 20): Lightning's
``trainer.test`` / ``trainer.predict`` on a checkpoint's weights, as a Lightning user expects."""

from __future__ import annotations

import csv
import json

import pytest
import torch
from torch.nn import functional as F
from torch.utils.data import TensorDataset

import tuneup
from tests.conftest import compose_config
from tuneup import TuneupError
from tuneup.trainer.components import Plan
from tuneup.trainer.runner import ConfigError
from tuneup.trainer.user_data import UserData, datasets_of

#: 96 held-out samples: three full batches of 32.
TEST = ["data.test_samples=96"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """One tiny fit; its last checkpoint is what every mode below reads."""
    out = tmp_path_factory.mktemp("modes") / "fit"
    tuneup.run(compose_config(TEST), run_dir=out)
    return sorted((out / "checkpoints").glob("*.ckpt"))[-1]


def by_hand(path, overrides=TEST):
    """The checkpoint's model and the config's data, outside tuneup's loops: (logits of every
    test sample in order, their labels)."""
    cfg = compose_config(overrides)
    plan = Plan(cfg)
    model = plan.build_model()
    state = torch.load(path, map_location="cpu", weights_only=False)["state_dict"]
    model.load_state_dict({k.removeprefix("model."): v for k, v in state.items()})
    data = plan.data
    test = data.test_split()
    pixels, labels = zip(*(test[i] for i in range(len(test))), strict=True)
    x = data.device_batch((torch.stack(pixels), torch.stack(labels)), torch.device("cpu"))[0]
    with torch.no_grad():
        return model.eval()(x), torch.stack(labels)


@pytest.fixture(scope="module")
def expected(checkpoint):
    return by_hand(checkpoint)


def test_mode_test_writes_the_test_metrics_of_the_held_out_split(checkpoint, expected, tmp_path):
    out = tmp_path / "test"
    tuneup.run(compose_config([*TEST, "mode=test", f"resume={checkpoint}"]), run_dir=out)
    summary = json.loads((out / "summary.json").read_text())
    logits, labels = expected
    assert summary["status"] == "ok" and summary["steps"] == 0 and summary["mode"] == "test"
    assert summary["test"]["loss"] == pytest.approx(
        F.cross_entropy(logits, labels).item(), rel=1e-5
    )
    assert summary["test"]["acc"] == pytest.approx((logits.argmax(1) == labels).float().mean())
    with open(out / "metrics.csv") as f:
        (row,) = list(csv.DictReader(f))
    assert float(row["test/loss"]) == pytest.approx(summary["test"]["loss"])
    assert not list(out.glob("checkpoints/*.ckpt"))  # nothing trained, nothing saved


def test_the_test_split_is_held_out_from_training_and_validation():
    data = Plan(compose_config(TEST)).data
    test = data.test_split()
    assert len(test) == 96
    seen = torch.stack([s[0] for s in (*data.train_set, *data.val_set)]).flatten(1)
    held = torch.stack([test[i][0] for i in range(len(test))]).flatten(1)
    assert not (held[:, None] == seen[None]).all(-1).any()  # no test image is a training one
    assert len(data.train_set) == 256 and len(data.val_set) == 128  # the same as without it


def test_mode_predict_writes_the_models_outputs_in_the_splits_order(checkpoint, expected, tmp_path):
    out = tmp_path / "predict"
    tuneup.run(compose_config([*TEST, "mode=predict", f"resume={checkpoint}"]), run_dir=out)
    summary = json.loads((out / "summary.json").read_text())
    predictions = torch.load(out / "predictions.pt")
    assert summary["status"] == "ok"
    assert summary["predict"] == {
        "split": "test",
        "samples": 96,
        "shape": [96, 10],
        "file": str(out / "predictions.pt"),
    }
    torch.testing.assert_close(predictions, expected[0], rtol=1e-5, atol=1e-5)


def test_mode_predict_without_a_test_split_predicts_on_the_validation_split(checkpoint, tmp_path):
    out = tmp_path / "predict_val"
    tuneup.run(
        compose_config(["data.test_samples=0", "mode=predict", f"resume={checkpoint}"]), run_dir=out
    )
    summary = json.loads((out / "summary.json").read_text())
    assert summary["predict"]["split"] == "val" and summary["predict"]["shape"] == [128, 10]


def test_mode_test_without_a_test_split_says_how_to_give_one(checkpoint, tmp_path):
    with pytest.raises(TuneupError) as info:
        tuneup.run(
            compose_config(["data.test_samples=0", "mode=test", f"resume={checkpoint}"]),
            run_dir=tmp_path / "none",
        )
    assert str(info.value) == (
        "mode=test: data=synthetic_images has no test split: give "
        "data.test_samples=N (held-out samples drawn after train and val)"
    )


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["mode=tests"], "mode='tests' is not allowed: expected one of 'fit', 'validate', "
         "'test', 'predict'; did you mean mode=test?"),
        (["mode=predict"], "mode=predict needs resume=<checkpoint> (a .ckpt file or a sharded "
         "checkpoint directory): the weights it predicts with"),
        (["mode=predict", "resume=CKPT", "strategy=ddp", "trainer.devices=2"],
         "mode=predict runs in one process, but this run has 2 (strategy=ddp, "
         "trainer.devices=2): use strategy=auto trainer.devices=1"),
        (["mode=test", "resume=CKPT", "resume_weights_only=true"], "resume_weights_only=true "
         "with mode=test: mode=test reads the checkpoint's weights only already"),
    ],
)  # fmt: skip
def test_bad_mode_settings_are_one_line_before_anything_runs(
    checkpoint, tmp_path, overrides, message
):
    overrides = [o.replace("CKPT", str(checkpoint)) for o in overrides]
    with pytest.raises(ConfigError) as info:
        tuneup.run(compose_config(overrides), run_dir=tmp_path / "run")
    assert message in str(info.value)
    assert not (tmp_path / "run" / "predictions.pt").exists()


def test_your_data_gives_a_test_split_as_a_third_dataset_or_by_name():
    sets = [TensorDataset(torch.zeros(n, 2)) for n in (4, 3, 2)]
    assert datasets_of(tuple(sets), "mine") == (*sets, None)
    assert datasets_of({"train": sets[0], "test": sets[2]}, "mine") == (
        sets[0],
        None,
        sets[2],
        None,
    )
    with pytest.raises(
        TuneupError,
        match=r"returned a dict with \['tst'\]; its keys are the "
        "splits: train, val, test, predict",
    ):
        datasets_of({"train": sets[0], "tst": sets[2]}, "mine")
    data = UserData(tuple(sets), {"batch_size": 2})
    assert data.test_split() is sets[2] and data.predict_split() == ("test", sets[2])
    assert UserData(tuple(sets[:2]), {"batch_size": 2}).predict_split() == ("val", sets[1])


def test_a_lightning_data_modules_test_dataloader_gives_the_test_split():
    import pytorch_lightning as pl
    from torch.utils.data import DataLoader

    sets = [TensorDataset(torch.zeros(n, 2)) for n in (4, 3, 2)]

    class Mine(pl.LightningDataModule):
        def train_dataloader(self):
            return DataLoader(sets[0], batch_size=2)

        def test_dataloader(self):
            return DataLoader(sets[2], batch_size=2)

    data = UserData(Mine(), {"batch_size": None})
    data.setup("test")
    assert data.test_split() is sets[2] and len(data.test_dataloader()) == 1


def test_digits_hold_out_a_real_test_split_when_asked_and_keep_their_validation_digits():
    from tuneup.zoo.data import digits

    train, val, test = digits.held_out(1797, 0.2, seed=1234, test_fraction=0.1)
    assert torch.equal(val, digits.split(1797, 0.2, seed=1234)[1])  # the same validation digits
    assert len(test) == 180 and len(train) == 1797 - 360 - 180
    assert not set(test.tolist()) & (set(train.tolist()) | set(val.tolist()))
    data = Plan(compose_config(["data=digits", "data.test_fraction=0.1"], tiny=False)).data
    assert len(data.test_split()) == 180
    assert Plan(compose_config(["data=digits"], tiny=False)).data.test_split() is None
