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
    site = make_distribution(tmp / "site", "tuneup-noisy", {"tuneup_noisy": NOISY},
                             {"noisy": "tuneup_noisy:Plugin"})  # fmt: skip
    run_dir = tmp / "run"
    result = run_cli(f"hydra.run.dir={run_dir}", "target.metric=val/acc", "target.value=0.01",
                     cwd=tmp, env={"PYTHONPATH": str(site)})  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return result, run_dir


def test_the_summary_fits_a_screen_and_leads_with_the_target_speed_and_memory(noisy_run):
    result, run_dir = noisy_run
    lines = result.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("tuneup run summary"))
    end = next(i for i, line in enumerate(lines) if line.startswith("summary written to"))
    table = lines[start:end]
    assert len(table) <= 25, "\n".join(table)
    assert table[0] == "tuneup run summary: ok, 8 steps, 1 epoch, 256 samples"
    keys = [line.split()[0] for line in table[2:-1]]
    assert keys[:3] == ["target", "samples_per_s", "peak_memory_bytes"]
    assert table[2].split(None, 1)[1].startswith("val/acc >= 0.01: reached at step ")
    assert f"run_dir {run_dir}: summary.json (every figure), metrics.csv, tuneup.log" in " ".join(
        " ".join(table).split())  # fmt: skip
    assert "target_history" not in result.stdout  # a list of dicts: summary.json has it
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["target_history"] and summary["noisy"] == {"figure": 1}  # all still there


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
    ranks = [{"rank": r, "parameter_bytes": 2**20, "peak_memory_bytes": (r + 1) * 2**30}
             for r in range(64)]  # fmt: skip
    table = format_table({"status": "ok", "world_size": 64, "per_rank": ranks}).splitlines()
    assert len(table) <= 25
    assert [line.split()[0] for line in table if line.startswith("per_rank")] == [
        "per_rank.0", "per_rank.1", "per_rank.2", "per_rank.3", "per_rank"]  # fmt: skip
    assert " ".join(table[6].split()) == "per_rank 64 processes: peak 1 GiB to 64 GiB"
