"""The sweep report from run directories written here (no training): rows, numbers, order,
baseline, best run, failures, the PNG, and ``python -m tuneup.report``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests.report_tables import assert_row_matches, best_line, png_size, read_table, run_name
from tuneup.report import ReportError, build_report, write_report
from tuneup.report.figure import figure_size_px
from tuneup.trainer import summary as run_summary

ROOT = Path(__file__).resolve().parents[1]
MIB = 2**20

CONFIG_ERROR = (
    "ConfigError: 1 problem(s) with this run's config:\n"
    "  - [precision] precision=fp16 needs a CUDA GPU"
)


def make_run(directory, name, overrides, **summary):
    """A run directory as run.py leaves it: summary.json and .hydra/overrides.yaml."""
    run_dir = directory / name
    (run_dir / ".hydra").mkdir(parents=True)
    OmegaConf.save(OmegaConf.create(list(overrides)), run_dir / ".hydra" / "overrides.yaml")
    if summary:
        run_summary.write({"status": "ok", "accelerator": "cuda", **summary}, run_dir)
    return run_dir


def ok(samples_per_s, memory_mib, acc, loss=1.5):
    return dict(
        samples_per_s=samples_per_s,
        peak_memory_bytes=int(memory_mib * MIB),
        train_loss=loss,
        val={"acc": acc, "loss": 1.0},
    )


@pytest.fixture
def sweep(tmp_path):
    """A 2x2 sweep: fp32/bf16 x contiguous/channels_last, plus a failed fp16 run."""
    common = ["trainer.max_steps=50"]
    make_run(
        tmp_path,
        "0",
        ["precision=fp32", "memory_format=contiguous", *common],
        **ok(100.0, 1000, 0.80),
    )
    make_run(
        tmp_path,
        "1",
        ["precision=fp32", "memory_format=channels_last", *common],
        **ok(130.0, 1000, 0.80),
    )
    make_run(
        tmp_path,
        "2",
        ["precision=bf16", "memory_format=contiguous", *common],
        **ok(180.0, 600, 0.795),
    )
    make_run(
        tmp_path,
        "3",
        ["precision=bf16", "memory_format=channels_last", *common],
        **ok(250.0, 550, 0.70),
    )
    make_run(
        tmp_path,
        "4",
        ["precision=fp16", "memory_format=contiguous", *common],
        status="failed",
        error=CONFIG_ERROR,
    )
    return tmp_path


def test_rows_are_sorted_fastest_first_with_failed_runs_last_and_match_summaries(sweep):
    write_report(build_report(sweep))
    rows = read_table((sweep / "report.md").read_text())
    assert [run_name(r) for r in rows] == ["3", "2", "1", "0", "4"]
    for row in rows:
        assert_row_matches(row, sweep / run_name(row), sweep / "0")
    by_name = {run_name(r): r for r in rows}
    assert by_name["0"]["run"].startswith("0 (baseline")
    assert by_name["2"]["speed-up"] == "1.80x"
    assert by_name["2"]["memory vs baseline"] == "0.60x"
    assert by_name["3"]["overrides"] == "`precision=bf16 memory_format=channels_last`"


def test_failed_run_shows_the_last_line_of_its_error(sweep):
    write_report(build_report(sweep))
    failed = read_table((sweep / "report.md").read_text())[-1]
    assert failed["status"] == "failed: ConfigError: [precision] precision=fp16 needs a CUDA GPU"
    assert failed["samples/s"] == failed["speed-up"] == "-"


def test_best_is_the_fastest_run_within_the_val_acc_tolerance(sweep):
    # run 3 is fastest but 0.10 below the baseline's val acc; run 2 is 0.005 below: within 0.01
    markdown = (write_report(build_report(sweep))[0]).read_text()
    line = best_line(markdown)
    assert line.startswith("**Best: run 2**: 1.80x the baseline's samples/s, 0.60x its peak memory")
    assert "`python run.py precision=bf16 memory_format=contiguous trainer.max_steps=50`" in line
    assert "at most 0.01 below the baseline's" in markdown
    looser = build_report(sweep, val_acc_tolerance=0.2)
    assert looser.best.name == "3"


def test_baseline_chosen_by_job_number_or_by_overrides(sweep):
    by_number = build_report(sweep, baseline="2")
    by_overrides = build_report(sweep, baseline="precision=bf16 memory_format=contiguous")
    for report in (by_number, by_overrides):
        assert report.baseline.name == "2"
        assert report.speed_up(report.baseline) == 1.0
        assert report.speed_up(next(r for r in report.runs if r.name == "3")) == pytest.approx(
            250 / 180
        )


def test_baseline_that_names_no_single_run_is_refused_with_the_runs_listed(sweep):
    with pytest.raises(ReportError, match=r"2 runs have these overrides.*0: precision=fp32"):
        build_report(sweep, baseline="precision=bf16")
    with pytest.raises(ReportError, match="no run has"):
        build_report(sweep, baseline="precision=tf32")


def test_baseline_saved_in_the_runs_config_is_used_after_the_fact(sweep):
    for name in "01234":
        OmegaConf.save({"report": {"baseline": 1}}, sweep / name / ".hydra" / "config.yaml")
    assert build_report(sweep).baseline.name == "1"
    assert build_report(sweep, baseline="0").baseline.name == "0"


def test_rank_by_val_acc_puts_the_most_accurate_run_first(sweep):
    report = build_report(sweep, rank_by="val_acc")
    assert [r.name for r in report.runs] == ["1", "0", "2", "3", "4"]  # 0.80 tie: faster first
    assert report.best.name == "1"


def test_png_is_an_image_of_the_expected_size(sweep):
    report = build_report(sweep)
    write_report(report)
    assert png_size(sweep / "report.png") == figure_size_px(5) == (1400, 600)
    assert figure_size_px(40) == (1400, 1480)  # taller with many runs: bars stay legible


def test_without_matplotlib_the_markdown_is_still_written(sweep, monkeypatch):
    monkeypatch.setitem(sys.modules, "tuneup.report.figure", None)  # import fails
    paths = write_report(build_report(sweep))
    assert [p.name for p in paths] == ["report.md"]
    assert "needs matplotlib" in (sweep / "report.md").read_text()


def test_run_without_summary_is_listed(sweep):
    make_run(sweep, "5", ["precision=amp"])  # the process died before writing its summary
    rows = read_table((write_report(build_report(sweep))[0]).read_text())
    assert rows[-1]["status"].startswith("no summary.json")


def report_cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "tuneup.report", *map(str, args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cli_reports_a_directory_of_single_runs(tmp_path):
    outputs = tmp_path / "outputs"
    make_run(outputs, "2024-05-01/10-00-00", ["optimizer.lr=0.1"], **ok(100.0, 900, 0.5))
    make_run(outputs, "2024-05-01/11-30-00", ["optimizer.lr=0.01"], **ok(90.0, 900, 0.6))
    done = report_cli(outputs, "--rank-by", "val_acc")
    assert done.returncode == 0, done.stderr
    rows = read_table((outputs / "report.md").read_text())
    assert [run_name(r) for r in rows] == ["2024-05-01/11-30-00", "2024-05-01/10-00-00"]
    assert png_size(outputs / "report.png") == (1400, 600)


def test_cli_on_a_directory_without_runs_says_so_and_exits_1(tmp_path):
    done = report_cli(tmp_path)
    assert done.returncode == 1
    assert (
        f"error: no runs in {tmp_path}: expected run directories holding summary.json"
        in done.stderr
    )
    assert not (tmp_path / "report.md").exists()


def test_rows_show_the_spread_and_mark_a_speed_up_within_noise(tmp_path):
    # Run 1 is 1.03x the baseline but its windows overlap the baseline's: within noise.
    # Run 2 is 2x with tight windows: a speed-up the interval shows.
    base = [98.0, 100.0, 102.0, 99.0, 101.0, 100.0]
    make_run(tmp_path, "0", ["precision=fp32"], **ok(100.0, 1000, 0.8), samples_per_s_windows=base)
    make_run(
        tmp_path,
        "1",
        ["precision=bf16"],
        **ok(103.0, 1000, 0.8),
        samples_per_s_windows=[90.0, 115.0, 100.0, 108.0, 95.0, 110.0],
    )
    make_run(
        tmp_path,
        "2",
        ["precision=fp16"],
        **ok(200.0, 1000, 0.5),
        samples_per_s_windows=[199.0, 201.0, 200.0, 198.0, 202.0, 200.0],
    )
    markdown = write_report(build_report(tmp_path))[0].read_text()
    rows = {run_name(r): r for r in read_table(markdown)}
    assert rows["0"]["spread"] == "98.0-102.0" and rows["0"]["speed-up interval"] == "-"
    assert rows["1"]["speed-up interval"].endswith("x within noise")
    low, high = map(float, rows["2"]["speed-up interval"].removesuffix("x").split("-"))
    assert 1.9 < low < 2.0 < high < 2.1
    # run 2 is fastest but 0.3 below the baseline's val acc: run 1 is best, within noise
    assert "**Best: run 1**" in markdown and "(within noise: its interval" in best_line(markdown)
    assert "load that differed between runs is not in it" in markdown


def test_a_sweep_without_windows_shows_no_interval(sweep):
    rows = read_table((write_report(build_report(sweep))[0]).read_text())
    assert {(r["spread"], r["speed-up interval"]) for r in rows} == {("-", "-")}
