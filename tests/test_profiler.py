"""Profiler: a Chrome trace of a window of training steps and the top operators in the summary."""

from __future__ import annotations

import json

import pytest

MLP = [
    "model=mlp",
    "model.hidden=[32]",
    "data.train_samples=256",
    "data.val_samples=64",
    "data.batch_size=32",
    "trainer.max_epochs=1",
    "trainer.enable_progress_bar=false",
]


def test_trace_of_the_active_steps_and_top_operators(train):
    summary, run_dir = train(
        *MLP,
        "profiler=on",
        "profiler.wait=2",
        "profiler.warmup=1",
        "profiler.active=2",
        "profiler.top_k=5",
        "trainer.accelerator=cpu",
        tiny=False,
    )
    report = summary["profiler"]
    assert report["trace"] == str(run_dir / "profiler" / "trace.json")
    trace = json.loads((run_dir / "profiler" / "trace.json").read_text())
    steps = {
        e["name"] for e in trace["traceEvents"] if e.get("name", "").startswith("ProfilerStep")
    }
    assert steps == {"ProfilerStep#3", "ProfilerStep#4"}  # after 2 waiting and 1 warm-up step
    assert report["profiled_steps"] == 2
    top = report["top_ops_self_cpu_ms"]
    assert 0 < len(top) <= 5
    assert all(ms > 0 for ms in top.values())  # summary.json sorts keys; the table prints by time
    # which operators lead depends on timing; that they are the window's own does not
    traced = {e.get("name", "") for e in trace["traceEvents"]}
    assert all(any(t.startswith(name.rstrip("*")) for t in traced) for name in top)
    assert {"aten::addmm", "aten::mm"} & traced  # the linear layers ran in the window
    assert "top_ops_self_cuda_ms" not in report  # CPU run
    assert summary["plugins"]["profiler"] == {"wait": 2, "warmup": 1, "active": 2, "top_k": 5}


def test_training_shorter_than_the_window_says_so(train):
    summary, run_dir = train(*MLP, "profiler=on", "profiler.wait=20", tiny=False)
    report = summary["profiler"]
    assert report["trace"] is None and not (run_dir / "profiler").exists()
    assert report["note"].startswith("training ended after 8 steps, before the profiling window")


def test_training_ending_inside_the_window_keeps_what_was_recorded(train):
    summary, run_dir = train(
        *MLP,
        "profiler=on",
        "profiler.wait=5",
        "profiler.warmup=1",
        "profiler.active=10",
        tiny=False,
    )
    assert summary["profiler"]["profiled_steps"] == 2  # steps 7 and 8 of 8
    assert (run_dir / "profiler" / "trace.json").is_file()


@pytest.mark.parametrize("override", ["profiler.active=0", "profiler.wait=-1", "profiler.top_k=x"])
def test_bad_window_is_a_check_error(make_config, override):
    from tuneup.plugins.profiler import Plugin

    cfg = make_config(["profiler=on", override])
    (found,) = Plugin(cfg).check(cfg)
    assert found.startswith(override.replace("=x", "='x'") + " is not allowed")
