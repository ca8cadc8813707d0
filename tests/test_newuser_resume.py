"""``resume=auto hydra.run.dir=<dir>`` alone, the docs' way to continue a killed run, with a
mistyped directory: refused in one line naming the directory meant, instead of training the
default model in a new directory."""

from __future__ import annotations

import sys

import pytest

from tuneup import cli
from tuneup.trainer.state.saved_overrides import nothing_to_resume


def test_a_mistyped_run_directory_is_refused_with_the_one_meant(tmp_path, monkeypatch, capsys):
    (tmp_path / "run_kill" / "checkpoints").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TUNEUP_COMMAND", "tuneup")  # main() sets it for the processes it starts
    monkeypatch.setattr(sys, "argv", ["tuneup", "resume=auto", "hydra.run.dir=run_kil"])
    with pytest.raises(SystemExit) as exit_:
        cli.main()
    assert exit_.value.code == 1
    assert capsys.readouterr().err == (
        "error: resume=auto hydra.run.dir=run_kil: run_kil does not exist, so there is no run to "
        "continue, and nothing else on the command line says what to train (it would train the "
        "default model); give the directory of the run to continue (did you mean "
        "hydra.run.dir=run_kill?), or the run's settings to start it there\n"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run_kill"]  # nothing trained


@pytest.mark.parametrize(
    "argv",
    [
        ["resume=auto", "hydra.run.dir=new", "model=mlp"],  # a job script's first start
        ["resume=auto", "hydra.run.dir=."],  # a directory that exists
        ["resume=auto"],  # a new directory of this moment's time
        ["-m", "resume=auto", "hydra.run.dir=new"],
        ["--config-dir", "conf", "--config-name", "mine", "resume=auto", "hydra.run.dir=new"],
        ["--config-name=mine", "resume=auto", "hydra.run.dir=new"],
    ],
)
def test_a_first_start_with_resume_auto_is_not_refused(tmp_path, monkeypatch, argv):
    monkeypatch.chdir(tmp_path)
    assert nothing_to_resume(argv) is None


@pytest.fixture
def in_a_sweep(monkeypatch):
    """Hydra's config of a running sweep, as the command sees it after Ctrl-C stopped it."""
    from hydra.conf import HydraConf
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    def sweep(sweeper: str, between_jobs: bool = True):
        cfg = OmegaConf.create({"hydra": OmegaConf.structured(HydraConf)})
        cfg.hydra.mode, cfg.hydra.sweep.dir = RunMode.MULTIRUN, "multirun/d/t"
        cfg.hydra.sweeper = {"_target_": sweeper}
        monkeypatch.setattr(HydraConfig.instance(), "cfg", None)
        monkeypatch.setattr(cli, "_sweep", None)
        HydraConfig.instance().set_config(cfg)
        if between_jobs:  # a job ran (cli.task), then Hydra put back its config of none
            cli._sweep_seen()
            HydraConfig.instance().cfg = None

    return sweep


def stopped_by_ctrl_c(monkeypatch, capsys) -> tuple[int, str]:
    """The exit code and standard error of the command when Ctrl-C reaches it in a sweep."""
    from tuneup import process_exit

    def interrupted():
        raise KeyboardInterrupt

    def end(code):
        raise SystemExit(code)

    monkeypatch.setattr(cli, "main", interrupted)
    monkeypatch.setattr(process_exit, "end_process", end)
    try:
        cli.console()
    except SystemExit as exit_:
        return exit_.code, capsys.readouterr().err
    except KeyboardInterrupt:  # not to pytest, which would stop the whole session
        pytest.fail("Ctrl-C left the command as Python's traceback")
    pytest.fail("the command returned")


def test_ctrl_c_in_an_autotune_says_how_to_continue_it(in_a_sweep, monkeypatch, capsys):
    in_a_sweep("hydra_plugins.tuneup_autotune.autotune_sweeper.AutotuneSweeper")
    assert stopped_by_ctrl_c(monkeypatch, capsys) == (
        130,
        "interrupted: Ctrl-C stopped the sweep in multirun/d/t; the same command with "
        "hydra.sweep.dir=multirun/d/t continues it (its study keeps the finished trials)\n",
    )


def test_ctrl_c_in_a_plain_sweep_says_where_its_runs_are(in_a_sweep, monkeypatch, capsys):
    in_a_sweep("hydra._internal.core_plugins.basic_sweeper.BasicSweeper")
    code, err = stopped_by_ctrl_c(monkeypatch, capsys)
    assert (code, err) == (
        130,
        "interrupted: Ctrl-C stopped the sweep in multirun/d/t: the runs it finished are there "
        "(python -m tuneup.report multirun/d/t compares them)\n",
    )


def test_ctrl_c_in_an_autotunes_trial_gives_the_autotunes_command_not_the_trials(
    in_a_sweep, monkeypatch, capsys
):
    """A trial stopped mid-run: its own resume command would train that trial alone."""
    from tuneup.trainer import console, runner
    from tuneup.trainer.state.preemption import Interrupted

    def stopped(cfg):
        raise Interrupted("Ctrl-C: stopped at step 22 without saving; continue with: tuneup ...")

    in_a_sweep("hydra_plugins.tuneup_autotune.autotune_sweeper.AutotuneSweeper", between_jobs=False)
    monkeypatch.setattr(runner, "run", stopped)
    monkeypatch.setattr(console, "route_libraries", lambda: None)  # the worker's logging as it is
    with pytest.raises(SystemExit) as exit_:
        cli.task(None)
    assert exit_.value.code == 130
    assert capsys.readouterr().err == (
        "interrupted: Ctrl-C stopped the sweep in multirun/d/t; the same command with "
        "hydra.sweep.dir=multirun/d/t continues it (its study keeps the finished trials)\n"
    )


# -- Ctrl-C before the run or the sweep's first job started (walk 16, point 3) ----------------


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["-m", "autotune=on", "model=mlp"], "the sweep"),
        (["model=mlp"], "the run"),
    ],
)
def test_ctrl_c_before_anything_started_is_one_line_and_130(
    argv, said, tmp_path, monkeypatch, capsys
):
    """Hydra composing: no sweep started, so no sweep directory is known."""
    from tuneup import process_exit, sweep_start

    def composing():
        raise KeyboardInterrupt

    def end(code):
        raise SystemExit(code)

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TUNEUP_COMMAND", "tuneup")  # main() sets it for the processes it starts
    monkeypatch.setattr(sys, "argv", ["tuneup", *argv])
    monkeypatch.setattr(sys, "path", list(sys.path))  # main() puts the current directory on it
    monkeypatch.setattr(cli, "_hydra_main", composing)
    monkeypatch.setattr(cli, "_sweep", None)  # no job of a sweep ran in this process
    monkeypatch.setattr(sweep_start, "started", None)  # nor did one start
    monkeypatch.setattr(cli, "_ran", False)
    monkeypatch.setattr(process_exit, "end_process", end)
    try:
        cli.console()
    except SystemExit as exit_:
        code = exit_.code
    except KeyboardInterrupt:  # not to pytest, which would stop the whole session
        pytest.fail("Ctrl-C left the command as Python's traceback")
    assert (code, capsys.readouterr().err) == (
        130,
        f"interrupted: Ctrl-C stopped tuneup before {said} started: nothing was trained\n",
    )
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_while_the_jobs_run_elsewhere_names_the_sweep_that_started(monkeypatch, capsys):
    """joblib's workers run the jobs (or the sweeper is still setting up): this process never
    held a job's config, but the callback of hydra.callbacks noted the sweep's start."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from tuneup import sweep_start
    from tuneup.trainer.config import builtin_dir

    monkeypatch.setattr(cli, "_sweep", None)
    monkeypatch.setattr(sweep_start, "started", None)
    callbacks = OmegaConf.load(builtin_dir() / "config.yaml").hydra.callbacks
    sweeper = "hydra_plugins.tuneup_autotune.autotune_sweeper.AutotuneSweeper"
    config = OmegaConf.create(
        {"hydra": {"sweep": {"dir": "multirun/d/t"}, "sweeper": {"_target_": sweeper}}}
    )
    instantiate(callbacks.sweep_start).on_multirun_start(config=config)
    assert stopped_by_ctrl_c(monkeypatch, capsys) == (
        130,
        "interrupted: Ctrl-C stopped the sweep in multirun/d/t; the same command with "
        "hydra.sweep.dir=multirun/d/t continues it (its study keeps the finished trials)\n",
    )
