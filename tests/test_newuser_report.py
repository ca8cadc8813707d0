"""A sweep report whose speed-up lies outside its own interval says so, and which to trust."""

from __future__ import annotations

from tests.report_tables import read_table, run_name
from tests.test_report import make_run, ok
from tuneup.report import build_report, write_report


def test_a_speed_up_outside_its_interval_is_pointed_out(tmp_path):
    # the baseline's samples/s (20) pulled down by a stall its windows (100) do not show: the
    # speed-up 5x lies outside its interval, about 1x
    base = [100.0, 101.0, 99.0, 100.0, 102.0, 98.0, 100.0, 100.0]
    make_run(tmp_path, "0", ["precision=fp32"], **ok(20.0, 1000, 0.8), samples_per_s_windows=base)
    even = [100.0, 101.0, 99.0, 100.0, 102.0, 98.0, 100.0, 100.0]
    make_run(tmp_path, "1", ["precision=bf16"], **ok(100.0, 1000, 0.8), samples_per_s_windows=even)
    # run 2 stalled as the baseline did: 1x, inside its interval
    make_run(tmp_path, "2", ["precision=fp16"], **ok(20.0, 1000, 0.8), samples_per_s_windows=even)
    markdown = write_report(build_report(tmp_path))[0].read_text()
    rows = {run_name(r): r for r in read_table(markdown)}
    assert rows["1"]["speed-up"] == "5.00x"
    low, high = map(float, rows["1"]["speed-up interval"].split("x")[0].split("-"))
    assert not low <= 5.0 <= high
    note = next(line for line in markdown.splitlines() if "outside their interval" in line)
    assert "(run 1: 5.00x, interval 0.98" in note and "run 2" not in note
    assert "The interval, which weighs every window alike, is the better guide" in note
