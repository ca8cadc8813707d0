"""The sweep presets: ``experiment=ablation`` and ``hparams_search=optuna``, run as users run them."""

from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf

from tests.report_tables import assert_row_matches, best_line, number, read_table, run_name
from tests.test_sweeps import sweep

pytestmark = pytest.mark.slow

FAST = [
    "data.val_samples=32",
    "data.image_size=8",
    "model.width=4",
    "trainer.enable_progress_bar=false",
]

ABLATION = [
    "baseline",
    "precision",
    "channels_last",
    "activation_checkpointing",
    "grad_accum",
    "all",
]
FEATURES = ABLATION[1:-1]


def features_on(summary: dict) -> set[str]:
    """Which ablation features a run really had on, from its summary's plugin settings."""
    plugins = summary["plugins"]
    on = {
        "precision": plugins["precision"]["name"] != "fp32",
        "channels_last": plugins.get("memory_format", {}).get("name") == "channels_last",
        "activation_checkpointing": "activation_checkpointing" in plugins,
        "grad_accum": plugins["grad_accum"]["steps"] > 1,
    }
    return {name for name, is_on in on.items() if is_on}


def test_ablation_runs_baseline_then_each_feature_alone_then_all(tmp_path):
    # 128 samples at 64 per optimizer step: 2 steps are one whole epoch, so the last is validated
    done, sweep_dir = sweep(
        tmp_path, "experiment=ablation", "data.train_samples=128", "trainer.max_steps=2", *FAST
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    expected = [set(), *({f} for f in FEATURES), set(FEATURES)]
    for job, (option, features) in enumerate(zip(ABLATION, expected, strict=True)):
        run_dir = sweep_dir / str(job)
        assert f"+ablation={option}" in OmegaConf.load(run_dir / ".hydra" / "overrides.yaml")
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["status"] == "ok"
        assert features_on(summary) == features, option
        assert (summary["steps"], summary["effective_batch_size"]) == (2, 64)  # fixed steps
        assert summary["val"]["acc"] is not None
        assert OmegaConf.load(run_dir / ".hydra" / "config.yaml").seed == 0
    rows = read_table((sweep_dir / "report.md").read_text())
    assert len(rows) == len(ABLATION)
    for row in rows:
        assert_row_matches(row, sweep_dir / run_name(row), sweep_dir / "0")
    assert next(r for r in rows if "baseline" in r["run"])["overrides"] == "`+ablation=baseline`"


def test_optuna_search_maximises_val_acc_and_reports_every_trial(tmp_path):
    optuna = pytest.importorskip("optuna")
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    done, sweep_dir = sweep(
        tmp_path,
        "hparams_search=optuna",
        "hydra.sweeper.n_trials=3",
        f"hydra.sweeper.storage={storage}",
        "data.batch_size=choice(16,32)",  # the search space is configurable from the command line
        "data.train_samples=128",
        "trainer.max_epochs=1",
        *FAST,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    study = optuna.load_study(study_name="tuneup", storage=storage)
    assert len(study.trials) == 3
    for trial in study.trials:  # trial k is job k; its value is what run.py returned
        run_dir = sweep_dir / str(trial.number)
        summary = json.loads((run_dir / "summary.json").read_text())
        assert trial.value == pytest.approx(summary["val"]["acc"])
        searched = dict(
            o.split("=", 1) for o in OmegaConf.load(run_dir / ".hydra" / "overrides.yaml")
        )
        assert 1e-4 <= float(searched["optimizer.lr"]) <= 0.5
        assert 1e-6 <= float(searched["optimizer.weight_decay"]) <= 1e-2
        assert searched["data.batch_size"] in {"16", "32"}
    markdown = (sweep_dir / "report.md").read_text()
    rows = read_table(markdown)
    assert len(rows) == 3
    for row in rows:
        assert_row_matches(row, sweep_dir / run_name(row), sweep_dir / "0")
    accs = [number(r["val acc"]) for r in rows]
    assert accs == sorted(accs, reverse=True)  # hparams_search ranks by val acc
    assert run_name(rows[0]) == str(study.best_trial.number) or accs[0] == accs[1]
    assert best_line(markdown).startswith(f"**Best: run {run_name(rows[0])}**")
