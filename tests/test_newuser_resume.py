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
    ],
)
def test_a_first_start_with_resume_auto_is_not_refused(tmp_path, monkeypatch, argv):
    monkeypatch.chdir(tmp_path)
    assert nothing_to_resume(argv) is None
