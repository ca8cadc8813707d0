"""Real data that no one here wrote, nothing downloaded: data=digits (scikit-learn's) trains, and
data=python_source cuts the standard library's own files into windows."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from tests.conftest import compose_config
from tuneup.zoo.data import digits as digits_module
from tuneup.zoo.data.python_source import PythonSource, source_files, stdlib

DIGITS = [
    "data=digits",
    "data.image_size=16",
    "data.batch_size=32",
    "model.width=8",
    "trainer.max_epochs=1",
    "trainer.enable_progress_bar=false",
    "checkpoint=off",
    "optimizer.lr=0.2",
]


def test_digits_train_well_above_chance(train):
    summary, _ = train(*DIGITS, tiny=False)
    assert summary["data_path"]["samples"] == {"train": 1437, "val": 360}
    assert summary["data_path"]["batches"] == "uint8"
    assert summary["val"]["acc"] > 0.5  # chance: 0.1


def test_digits_split_is_fixed_by_the_seed():
    train, val = digits_module.split(1797, 0.2, seed=1)
    again, _ = digits_module.split(1797, 0.2, seed=1)
    other, _ = digits_module.split(1797, 0.2, seed=2)
    assert torch.equal(train, again) and not torch.equal(train, other)
    assert len(val) == 360 and not set(train.tolist()) & set(val.tolist())


def test_digits_without_scikit_learn_names_the_extra(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "sklearn" else real(n, *a)
    )
    problems = digits_module.Digits.problems(compose_config(["data=digits"], tiny=False))
    assert problems == [problems[0]] and "pip install 'tuneup[digits]'" in problems[0]


def test_python_source_windows_are_the_standard_library():
    cfg = compose_config(
        ["data=python_source", "data.max_bytes=65536", "data.context=64"], tiny=False
    )
    assert PythonSource.problems(cfg) == []
    data = PythonSource(cfg.data)
    data.setup()
    first = next(source_files(stdlib())).read_bytes()
    x, y = data.train_set[0]
    assert bytes(x.tolist()) == first[:64] and bytes(y.tolist()) == first[1:65]
    assert data.bytes == 65536 and len(data.val_set) == (6554 - 1) // 64
    assert "site-packages" not in "".join(str(p) for p in source_files(stdlib()))


def test_python_source_too_small_is_a_check_error():
    cfg = compose_config(["data=python_source", "data.max_bytes=2048"], tiny=False)
    (problem,) = PythonSource.problems(cfg)
    assert "raise data.max_bytes" in problem


@pytest.mark.parametrize("key, value", [("channels", 2), ("val_fraction", 1.5)])
def test_digits_bad_settings(key, value):
    cfg = compose_config(["data=digits", f"data.{key}={value}"], tiny=False)
    (problem,) = digits_module.Digits.problems(cfg)
    assert f"data.{key}={value}" in problem
