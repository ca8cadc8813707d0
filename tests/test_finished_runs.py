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
    return {p.relative_to(run_dir): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(run_dir.rglob("*")) if p.is_file()}  # fmt: skip


def test_resume_auto_on_a_finished_run_leaves_it_untouched_and_says_so(train, cli, tmp_path):
    _, run_dir = train(*MLP)  # one epoch: finished
    before = snapshot(run_dir)
    result = cli(*MLP, "resume=auto", run_dir=run_dir)
    assert result.returncode == 0, result.stderr[-2000:]
    assert (
        "the run is complete: epoch000-step00000008.ckpt already reached trainer.max_epochs=1 "
        f"(step 8, 1 epochs), so nothing was trained and {run_dir} is left as it was. To train "
        "further, raise trainer.max_epochs, e.g. trainer.max_epochs=2 resume=auto"
    ) in result.stdout
    assert snapshot(run_dir) == before  # summary.json, metrics.csv, checkpoints, log: as they were
    assert not (run_dir / "metrics-1.csv").exists()


@pytest.mark.parametrize("limit", ["trainer.max_steps", "trainer.max_epochs"])
def test_a_finished_run_is_recognised_by_either_limit(train, tmp_path, limit, capsys):
    value = 3 if limit == "trainer.max_steps" else 1
    first, run_dir = train(*MLP, f"{limit}={value}", "trainer.max_epochs=1")
    before = snapshot(run_dir)
    acc = run(compose_config([*MLP, f"{limit}={value}", "resume=auto"]), run_dir=run_dir)
    assert acc == first["val"]["acc"] and snapshot(run_dir) == before
    assert f"reached {limit}={value}" in capsys.readouterr().out


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
