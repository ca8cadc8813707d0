"""After a preemption the printed hint is a command that continues the run as printed."""

from __future__ import annotations

import json
import os
import shlex
import subprocess

from tests.conftest import ROOT, TINY, TINY_IMAGES, python
from tests.plugin_dists import make_distribution
from tuneup.trainer.state.preemption import EXIT_CODE

TERM = """
    import os
    import signal

    from tuneup import hookimpl


    class Plugin:
        seen = 0

        @hookimpl
        def on_after_backward(self):
            self.seen += 1
            if self.seen == int(os.environ.get("TERM_AT", "0")):
                os.kill(os.getpid(), signal.SIGTERM)
"""


def test_the_hint_after_a_preemption_continues_the_run_as_printed(tmp_path):
    site = make_distribution(
        tmp_path / "site", "tuneup-term", {"tuneup_term": TERM}, {"term": "tuneup_term:Plugin"}
    )
    env = {**os.environ, "PYTHONPATH": str(site), "PYTHONUNBUFFERED": "1"}
    # no hydra.run.dir: the run gets a fresh default directory under the current one
    first = subprocess.run(
        [*python(), str(ROOT / "run.py"), *TINY, "optimizer.lr=0.02"],
        cwd=tmp_path,
        env={**env, "TERM_AT": "3"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert first.returncode == EXIT_CODE, first.stderr[-3000:]
    hint = first.stderr.split("continue with: ", 1)[1].strip()
    (run_dir,) = (tmp_path / "outputs").glob("*/*")
    assert hint == (
        f"python {ROOT / 'run.py'} {' '.join(TINY)} optimizer.lr=0.02 resume=auto "
        f"hydra.run.dir={run_dir}"
    )
    words = shlex.split(hint)
    again = subprocess.run(
        [*python(), *words[1:]], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert again.returncode == 0, again.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["resumed_from"].endswith("step00000003.ckpt")
    assert summary["steps"] == 256 // 32  # the whole epoch, in the run's own directory


def test_in_a_slurm_launcher_job_the_hint_runs_tuneup_itself(monkeypatch, tmp_path):
    """A job of hydra/launcher=slurm runs submitit's _submit.py, which takes a job folder, not
    overrides; the hint names the tuneup module instead (and, in the job, the requeue follows)."""
    from tuneup.trainer.state import preemption

    submit = "/site-packages/submitit/core/_submit.py"
    monkeypatch.setattr("sys.argv", [submit, str(tmp_path / ".submitit" / "1")])
    hint = preemption.continue_command(tmp_path / "run")
    assert hint == f"python -m tuneup resume=auto hydra.run.dir={tmp_path / 'run'}"
    monkeypatch.setattr("sys.argv", ["/home/me/train.py"])  # a user's own script: run again
    assert preemption.continue_command("r").startswith("python /home/me/train.py resume=auto")


TERM_RANK_0 = """
    import os
    import signal

    from tuneup import hookimpl


    class Plugin:
        @hookimpl
        def on_after_backward(self, trainer):
            if trainer.global_rank == 0 and trainer.global_step == 1:
                os.kill(os.getpid(), signal.SIGTERM)
"""


def test_a_preempted_run_of_two_processes_says_so_once_in_rank_0s_words(tmp_path):
    """Every rank stops at the same step and raises; only the command's own process (local
    rank 0) prints, not the rank it started on the same console (on main each rank printed its
    own line: rank 1's said 'received a stop signal on another rank'). One command per node:
    tests/test_multinode.py."""
    site = make_distribution(
        tmp_path / "site",
        "tuneup-term0",
        {"tuneup_term0": TERM_RANK_0},
        {"term0": "tuneup_term0:Plugin"},
    )
    env = {**os.environ, "PYTHONPATH": str(site), "PYTHONUNBUFFERED": "1"}
    run = subprocess.run(
        [
            *python(),
            str(ROOT / "run.py"),
            *TINY,
            TINY_IMAGES,
            "strategy=ddp",
            "trainer.accelerator=cpu",
            "trainer.devices=2",
            "data.batch_size=16",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == EXIT_CODE, run.stderr[-3000:]
    (line,) = [x for x in run.stderr.splitlines() if x.startswith("preempted:")]
    assert line.startswith("preempted: received SIGTERM: stopped after step 2 and saved ")
    assert "another rank" not in run.stderr
