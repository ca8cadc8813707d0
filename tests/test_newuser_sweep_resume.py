"""An autotune or Optuna sweep stopped with Ctrl-C in a trial, then continued: the stopped
trial's run, whose summary says ``interrupted`` and how to resume that trial alone, is marked
as the killed one's is, run again as a new trial, so the continued sweep does not count it as
a run that did not finish."""

from __future__ import annotations

from types import SimpleNamespace

from omegaconf import OmegaConf

from tuneup.optuna.resume import mark_interrupted_runs
from tuneup.optuna.study import RETRY_ATTR
from tuneup.report import build_report
from tuneup.trainer import summary as run_summary


def trial_run(sweep, job: str, trial: int, summary: dict | None):
    run_dir = sweep / job
    (run_dir / ".hydra").mkdir(parents=True)
    hydra = {"hydra": {"sweeper": {"trial": trial, "study_name": "autotune"}}}
    OmegaConf.save(hydra, run_dir / ".hydra" / "hydra.yaml")
    OmegaConf.save([f"optimizer.lr=0.{trial}"], run_dir / ".hydra" / "overrides.yaml")
    if summary is not None:
        run_summary.write(summary, run_dir)
    return run_dir


def test_a_trial_stopped_with_ctrl_c_is_marked_run_again(tmp_path):
    ok = {"status": "ok", "samples_per_s": 100.0, "peak_memory_bytes": 1}
    trial_run(tmp_path, "0", 0, ok)
    stopped = trial_run(
        tmp_path,
        "1",
        1,
        {
            "status": "interrupted",
            "samples_per_s": 90.0,
            "error": "Interrupted: Ctrl-C: stopped at step 22 without saving; continue with: ...",
        },
    )
    killed = trial_run(tmp_path, "2", 2, None)
    recovered = [SimpleNamespace(number=1), SimpleNamespace(number=2)]
    waiting = [SimpleNamespace(user_attrs={RETRY_ATTR: n}) for n in (1, 2)]
    study = SimpleNamespace(study_name="autotune", get_trials=lambda **_: waiting)
    for retry in (3, 4):  # the values asked again, as trials 3 and 4
        waiting[retry - 3].number = retry

    written = mark_interrupted_runs(tmp_path, study, recovered)

    assert sorted(p.parent.name for p in written) == ["1", "2"]
    marked = run_summary.read(stopped)
    assert marked["error"] == (
        "the sweep was stopped (Ctrl-C) while trial 1 ran: the trial was marked failed, its "
        "values run again as trial 3"
    )
    assert marked["optuna_trial"] == {"number": 1, "run_again_as": 3}
    assert marked["samples_per_s"] == 90.0  # what it measured is kept
    assert run_summary.read(killed)["error"].startswith("the sweep was killed while trial 2 ran")
    assert run_summary.read(tmp_path / "0") == ok  # a finished run is left as it is
    assert build_report(tmp_path).not_ok == []


def test_a_sweep_refused_before_it_starts_leaves_no_empty_directory(tmp_path):
    """The sweep directory is checked writable at the sweep's start, then left to the sweeper
    to make: ``tuneup -m ... autotune.cost=tme`` left an empty ``multirun/<date>/<time>``."""
    from tuneup.trainer.state.run_dir import RunDirectoryCheck

    sweep = tmp_path / "multirun" / "2026-01-01" / "12-00-00"
    (tmp_path / "multirun").mkdir()
    RunDirectoryCheck().on_multirun_start(
        OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}}})
    )
    assert [p.name for p in tmp_path.iterdir()] == ["multirun"]
    assert list((tmp_path / "multirun").iterdir()) == []  # the date's level too, but not its own
