"""logger=csv|tensorboard|wandb: files land in the run directory; a missing package is a clear error."""

import csv
import hashlib
import importlib.util

import pytest

from tests.conftest import compose_config
from tuneup import TuneupError
from tuneup.trainer.runner import ConfigError, run


def test_csv_logger_writes_metrics_into_the_run_directory(train):
    _, run_dir = train()
    rows = list(csv.DictReader((run_dir / "metrics.csv").open()))
    assert any(row.get("train/loss") for row in rows)
    assert any(row.get("val/acc") for row in rows)


def test_a_resumed_run_keeps_the_earlier_metrics(train, tmp_path):
    _, run_dir = train(run_dir=tmp_path / "run")
    first = (run_dir / "metrics.csv").read_text()
    train("resume=auto", "trainer.max_epochs=2", run_dir=run_dir)
    assert (run_dir / "metrics-1.csv").read_text() == first
    rows = list(csv.DictReader((run_dir / "metrics.csv").open()))
    assert rows and all(int(row["epoch"]) == 1 for row in rows)  # the resumed epoch


def snapshot(run_dir) -> dict[str, str]:
    """Each file's SHA-256 by its path in ``run_dir``."""
    return {
        str(p.relative_to(run_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in run_dir.rglob("*")
        if p.is_file()
    }


def test_tensorboard_logger_writes_event_files_and_none_in_a_refused_resume(train, tmp_path):
    """A resume refused as training starts (other data, mid-epoch) makes no event file and
    changes none (Lightning makes the logger's first file as the fit is set up); the run's
    own resume then continues."""
    _, run_dir = train("logger=tensorboard", "checkpoint.every_n_steps=3")
    assert list(run_dir.glob("events.out.tfevents.*"))
    before = snapshot(run_dir)
    step_3 = run_dir / "checkpoints" / "epoch000-step00000003.ckpt"
    with pytest.raises(TuneupError, match="cannot resume mid-epoch"):
        train("logger=tensorboard", f"resume={step_3}", "data.train_samples=128", run_dir=run_dir)
    assert snapshot(run_dir) == before
    summary, _ = train("logger=tensorboard", "resume=auto", "trainer.max_epochs=2", run_dir=run_dir)
    assert summary["status"] == "ok" and summary["epochs"] == 2


def test_wandb_needs_its_package_and_runs_offline(tmp_path, train):
    if importlib.util.find_spec("wandb") is None:
        with pytest.raises(
            ConfigError, match=r"logger=wandb needs the 'wandb' package.*tuneup\[wandb\]"
        ):
            run(compose_config(["logger=wandb"]), run_dir=tmp_path)
    else:  # the tuneup[wandb] extra is installed: offline files in the run directory
        _, run_dir = train("logger=wandb")
        assert (run_dir / "wandb").is_dir()
