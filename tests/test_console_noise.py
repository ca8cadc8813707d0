"""The console says what is true and no more: a crash is one line naming where it happened and
the log file that holds the traceback; start-up, Lightning's tips, leftovers (issue 25)."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
import textwrap

from tests.conftest import ROOT, python, run_cli

BOOM = """
    import torch


    class Net(torch.nn.Module):
        def __init__(self, width: int = 8, steps_before_failing: int = 3):
            super().__init__()
            self.linear = torch.nn.Linear(3 * 32 * 32, 10)
            self.left = steps_before_failing

        def forward(self, x):
            if self.training:
                self.left -= 1
                if self.left < 0:
                    return self.linear(x)  # not flattened: torch raises a shape error
            return self.linear(x.flatten(1))
"""


def test_an_exception_in_training_is_one_line_naming_where_and_the_log_file(cli, tmp_path):
    (tmp_path / "boom_model.py").write_text(textwrap.dedent(BOOM))
    args = ("model=custom", "model._target_=boom_model.Net", "data.image_size=32")  # its Linear
    result = cli(*args, cwd=tmp_path)
    assert result.returncode == 1
    log = tmp_path / "run" / "tuneup.log"
    (line,) = [x for x in result.stderr.splitlines() if x.startswith("error:")]
    assert line.startswith("error: RuntimeError: mat1 and mat2 shapes cannot be multiplied")
    assert "raised in torch.nn.modules.linear" in line
    assert "called from boom_model (line 15, in forward) at step 3" in line
    assert f"the traceback is in {log}" in line
    assert "Traceback" not in result.stderr + result.stdout
    assert "Traceback" in log.read_text() and "return self.linear(x)" in log.read_text()

    loud = cli(
        *args, "resume=null", cwd=tmp_path, run_dir=tmp_path / "loud", env={"HYDRA_FULL_ERROR": "1"}
    )
    assert loud.returncode == 1 and "Traceback" in loud.stderr


#: The docs' kind of short run: 8 steps an epoch, 48 in all; the log interval left to tuneup.
SHORT = [
    "data.train_samples=128",
    "data.val_samples=16",
    "data.batch_size=16",
    "model.width=4",
    "data.image_size=8",
    "trainer.max_epochs=6",
    "trainer.enable_progress_bar=false",
    "checkpoint=off",
]


def test_a_plain_run_says_it_once_and_leaves_no_noise_behind(tmp_path):
    run_dir = tmp_path / "run"
    result = run_cli(
        *SHORT,
        "trainer.enable_progress_bar=auto",
        f"hydra.run.dir={run_dir}",
        cwd=tmp_path,
        tiny=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    log = (run_dir / "tuneup.log").read_text()
    assert "Epoch 0" not in result.stdout + result.stderr  # no progress bar into a file (auto)
    assert result.stdout.count("tuneup: small_resnet on synthetic_images") == 1
    assert "smaller than the logging interval" not in result.stdout + result.stderr + log
    assert "Tip:" not in log and "litlogger" not in log  # Lightning's adverts: nowhere
    # Lightning's advice to use srun, wherever Slurm's client is installed: the log file's only
    assert "`srun`" not in result.stdout + result.stderr
    assert "terminate called" not in result.stderr  # a thread left running at exit
    with open(run_dir / "metrics.csv") as f:
        losses = [row for row in csv.DictReader(f) if row.get("train/loss")]
    assert len(losses) > 2  # 48 steps: a point every 4, not every 20
    assert not (run_dir / ".tuneup.lock").exists()  # the run ended: its lock is gone


#: A run whose process group still has a C++ thread at work when the run returns: as a Gloo
#: worker destroying a collective that finished a moment before (what aborted DDP runs on CPU
#: now and then), here made certain by a Python callback on the collective's future.
LATE_THREAD = """
import tempfile, time
import torch, torch.distributed as dist
from tuneup import cli

def run():
    store = dist.FileStore(tempfile.mktemp(), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    def late(future):
        time.sleep(0.5)  # the run returns meanwhile: the interpreter would be torn down
        return future.value()
    dist.all_reduce(torch.ones(4), async_op=True).get_future().then(late)
    print("run returned", flush=True)

cli.main = run
cli.console()
"""


def test_a_finished_run_exits_cleanly_while_a_thread_of_its_process_group_still_works():
    """Issue 32 point 12: "terminate called without an active exception" and exit code 134
    after a run that had finished. A real interpreter (the zygote's children never tear one
    down), and the command's own ending (tuneup.cli.console)."""
    result = subprocess.run(
        [sys.executable, "-c", LATE_THREAD], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert "run returned" in result.stdout
    assert "terminate called" not in result.stderr and "Fatal Python" not in result.stderr
    assert result.returncode == 0, result.stderr[-2000:]


def test_plugins_list_shows_what_is_off_and_leaves_no_directory(tmp_path):
    result = run_cli("plugins.list=true", "compile=on", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    listed = result.stdout.split("Installed, switched off (and what switches each on):")[1]
    switched = dict(line.split(None, 1) for line in listed.split("\n\n")[0].strip().splitlines())
    assert switched["memory_format"] == "on with: memory_format=channels_last"
    assert (
        switched["kernels"] == "on with: kernels=[cross_entropy] | kernels=[linear_cross_entropy]"
    )
    assert "compile" not in switched  # on: listed as active
    assert switched["optuna_trial"] == "on with: hparams_search=optuna"
    assert not (tmp_path / "outputs").exists()  # Hydra's run directory: nothing was run there


def test_a_sweep_prints_a_line_per_job_and_reproduces_the_command_run(tmp_path):
    sweep = tmp_path / "sweep"
    small = [
        "data.train_samples=128",
        "data.batch_size=16",
        "data.val_samples=32",
        "data.image_size=8",
        "model.width=4",
        "trainer.max_epochs=1",
        "trainer.enable_progress_bar=false",
    ]
    command = [
        *python(),
        "-m",
        "tuneup",
        "-m",
        f"hydra.sweep.dir={sweep}",
        *small,
        "optimizer.lr=0.1,0.01",
    ]
    result = subprocess.run(
        command,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    jobs = [line for line in lines if line.startswith("#")]
    assert [j.split()[0] for j in jobs] == ["#0", "#1"]
    assert all(": ok, " in j and "samples/s" in j and "summary written to" in j for j in jobs)
    ours = [line for line in lines if line.startswith(("#", "[", "tuneup", "summary"))]
    assert len(ours) == 4, result.stdout  # Hydra's "Launching", a line per job, the report
    assert "tuneup run summary" not in result.stdout and "step_time_ms" not in result.stdout
    report = (sweep / "report.md").read_text()
    assert "; reproduce: `python -m tuneup data.train_samples=128 " in report
