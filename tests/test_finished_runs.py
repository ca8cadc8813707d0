"""resume=auto on a run that has finished leaves it as it was and says how to train further; a
resumed run's summary gives the whole run's figures and its own session's, each named so."""

from __future__ import annotations

import json

import pytest

from tests.conftest import compose_config
from tuneup.trainer.runner import run

MLP: list[str] = []  # the default model, TINY: 8 steps of 32 samples an epoch


def snapshot(run_dir):
    """Every file of a run directory: its bytes and modification time."""
    return {
        p.relative_to(run_dir): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(run_dir.rglob("*"))
        if p.is_file()
    }


@pytest.mark.parametrize("limit", ["trainer.max_steps", "trainer.max_epochs"])
def test_resume_auto_on_a_finished_run_leaves_it_untouched_and_says_so(train, limit, capsys):
    value = 3 if limit == "trainer.max_steps" else 1
    first, run_dir = train(*MLP, f"{limit}={value}")
    before = snapshot(run_dir)
    acc = run(compose_config([*MLP, f"{limit}={value}", "resume=auto"]), run_dir=run_dir)
    steps = 3 if limit == "trainer.max_steps" else 8
    epochs = "0 epochs" if limit == "trainer.max_steps" else "1 epoch"
    assert (
        f"the run is complete: epoch000-step{steps:08d}.ckpt already reached {limit}={value} "
        f"(step {steps}, {epochs}), so nothing was trained and {run_dir} is left as it "
        f"was. To train further, raise {limit}, e.g. {limit}={2 * value} resume=auto"
    ) in capsys.readouterr().out
    assert acc == first["val"]["acc"]  # returned as a run does (the command exits 0)
    assert snapshot(run_dir) == before  # summary.json, metrics.csv, checkpoints, log: untouched
    assert not (run_dir / "metrics-1.csv").exists()


def test_a_resumed_run_gives_the_runs_totals_and_its_sessions(train, tmp_path):
    first, run_dir = train(*MLP, "trainer.max_steps=3")  # 32 samples a step, 8 steps an epoch
    assert (first["steps"], first["samples"], first["micro_batches"]) == (3, 96, 3)
    resumed, _ = train(*MLP, "trainer.max_steps=8", "resume=auto", run_dir=run_dir)
    assert resumed["status"] == "ok"
    assert (resumed["steps"], resumed["samples"], resumed["micro_batches"]) == (8, 256, 8)
    session = ("steps_this_session", "samples_this_session", "micro_batches_this_session")
    assert tuple(resumed[k] for k in session) == (5, 160, 5)
    assert tuple(first[k] for k in session) == (3, 96, 3)  # not resumed: the whole run
    curve = resumed["loss_curve"]  # this session's losses, on the run's sample axis
    assert curve["samples"][0] > 96 and curve["samples"][-1] == 256
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["resumed_from"].endswith("epoch000-step00000003.ckpt")
