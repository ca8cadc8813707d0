"""A console that fits a screen (issue 43 point 17): the summary table leads with what was asked
for and stays within 25 lines; what an installed plugin's import prints or warns (transformers'
and torchao's notices, a library's print) goes to the run's log file, not the console."""

from __future__ import annotations

import json

import pytest

from tests.plugin_dists import make_distribution
from tuneup.trainer.summary import format_table

NOISY = """
    import logging
    import sys
    import warnings

    print("NOISY print at import")
    sys.stderr.write("NOISY stderr at import\\n")
    warnings.warn("NOISY warning at import")
    logging.getLogger("noisy_lib").warning("NOISY log line at import")

    from tuneup import hookimpl

    class Plugin:
        @hookimpl
        def report(self, summary):
            summary["noisy"] = {"figure": 1}
            raise RuntimeError("noisy report failed")
"""


@pytest.fixture(scope="module")
def noisy_run(tmp_path_factory):
    """One run of the command, with a noisy plugin installed and a target asked for."""
    from tests.conftest import run_cli

    tmp = tmp_path_factory.mktemp("console")
    site = make_distribution(
        tmp / "site", "tuneup-noisy", {"tuneup_noisy": NOISY}, {"noisy": "tuneup_noisy:Plugin"}
    )
    run_dir = tmp / "run"
    result = run_cli(
        f"hydra.run.dir={run_dir}",
        "target.metric=val/acc",
        "target.value=0.01",
        "data.train_samples=250",  # 7 full batches of 32: 26 left out an epoch
        cwd=tmp,
        env={"PYTHONPATH": str(site)},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result, run_dir


def test_the_summary_fits_a_screen_and_leads_with_the_target_speed_and_memory(noisy_run):
    result, run_dir = noisy_run
    lines = result.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("tuneup run summary"))
    end = next(i for i, line in enumerate(lines) if line.startswith("summary written to"))
    table = lines[start:end]
    assert len(table) <= 25, "\n".join(table)
    assert table[0] == "tuneup run summary: ok, 7 steps, 1 epoch, 224 samples"
    keys = [line.split()[0] for line in table[2:-1]]
    assert keys[:3] == ["target", "samples_per_s", "peak_memory_bytes"]
    assert table[2].split(None, 1)[1].startswith("val/acc >= 0.01: reached at step ")
    assert f"run_dir {run_dir}: summary.json (every figure), metrics.csv, tuneup.log" in " ".join(
        " ".join(table).split()
    )
    assert "target_history" not in result.stdout  # a list of dicts: summary.json has it
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["target_history"] and summary["noisy"] == {"figure": 1}  # all still there


def test_the_samples_an_epoch_leaves_out_are_in_the_summary_and_on_the_console(noisy_run):
    """250 training samples in full batches of 32 (the last partial batch is not made): 7 steps,
    and the 26 samples left out of each epoch said, not silent (issue 47 point 10)."""
    result, run_dir = noisy_run
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 7 and summary["dropped_per_epoch"] == 250 - 7 * 32
    assert (
        "dropped_per_epoch 26 training samples left out of each epoch: training batches are "
        "full, a different 26 each epoch"
    ) in " ".join(result.stdout.split())


def test_a_plugin_failing_in_report_is_one_console_line_and_a_summary_row(noisy_run):
    result, run_dir = noisy_run
    line = "plugin 'noisy' failed in hook 'report': RuntimeError: noisy report failed"
    assert (result.stdout + result.stderr).count(line) == 1
    assert "Traceback" not in result.stdout + result.stderr  # in the log file
    assert "Traceback" in (run_dir / "tuneup.log").read_text()
    assert "report_errors.noisy  RuntimeError: noisy report failed" in result.stdout
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["report_errors"] == {"noisy": "RuntimeError: noisy report failed"}
    assert summary["status"] == "ok" and result.returncode == 0


def test_a_plugins_import_noise_goes_to_the_log_file_not_the_console(noisy_run):
    result, run_dir = noisy_run
    log = (run_dir / "tuneup.log").read_text()
    for noise in ("NOISY print", "NOISY stderr", "NOISY warning", "NOISY log line"):
        assert noise not in result.stdout + result.stderr, noise
        assert noise in log, noise
    assert "importing plugin 'noisy'" in log  # the printed lines say where they came from


def test_many_processes_are_summed_up_past_four_rows():
    ranks = [
        {"rank": r, "parameter_bytes": 2**20, "peak_memory_bytes": (r + 1) * 2**30}
        for r in range(64)
    ]
    table = format_table({"status": "ok", "world_size": 64, "per_rank": ranks}).splitlines()
    assert len(table) <= 25
    assert [line.split()[0] for line in table if line.startswith("per_rank")] == [
        "per_rank.0",
        "per_rank.1",
        "per_rank.2",
        "per_rank.3",
        "per_rank",
    ]
    assert " ".join(table[6].split()) == "per_rank 64 processes: peak 1 GiB to 64 GiB"


@pytest.mark.parametrize(("size", "shards", "batch", "dropped"),
                         [(341, 1, 32, 21), (341, 2, 16, 21), (10, 3, 2, 0), (5, 1, 8, 5)])  # fmt: skip
def test_the_samples_left_out_count_every_shards_last_partial_batch(size, shards, batch, dropped):
    """Each of ``shards`` processes trains its share's full batches: 341 on 2 shards of 171 in
    batches of 16 leaves 11 + 11 - 1 (the padding) = 21 out; 10 on 3 shards in batches of 2
    trains every sample (and a padding one twice); a batch above the data trains nothing."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from tuneup.trainer.state.data_order import (
        ResumableLoader,
        ResumableSampler,
        dropped_per_epoch,
    )

    data = TensorDataset(torch.zeros(size))
    sampler = ResumableSampler(size, rank=0, num_replicas=shards)
    loader = ResumableLoader(data, batch_size=batch, sampler=sampler, drop_last=True)
    assert dropped_per_epoch(loader) == dropped
    assert dropped_per_epoch(DataLoader(data, batch_size=batch)) is None  # the user's, as it is
