"""OpenMP's spin where other work shares the CPUs (trainer/openmp.py), decided before torch
loads libgomp; what the run's summary says of it."""

import subprocess
import sys

from tuneup.trainer import openmp
from tuneup.trainer.summary import format_table


def test_a_busy_machine_gets_the_short_spin_and_an_idle_one_libgomps_default():
    busy = {"PATH": "/bin"}
    assert openmp.wait_briefly(1.6, busy)
    assert busy["GOMP_SPINCOUNT"] == "1000"
    assert busy[openmp.VARIABLE] == (
        "short spin (GOMP_SPINCOUNT=1000): 1.6 CPU(s) busy with other work when the command started"
    )
    idle = {"PATH": "/bin"}
    assert not openmp.wait_briefly(0.3, idle)
    assert "GOMP_SPINCOUNT" not in idle
    assert idle[openmp.VARIABLE].startswith("libgomp default: 0.3 CPU(s) busy")


def test_what_the_shell_set_is_kept():
    for own in ({"GOMP_SPINCOUNT": "300000"}, {"OMP_WAIT_POLICY": "ACTIVE"}):
        environ = dict(own)
        assert not openmp.wait_briefly(2.0, environ) and environ == own


def test_others_busy_leaves_this_processs_own_cpu_out():
    # 1 s of wall time; the CPUs were busy 1.5 s, 0.5 s of it this process's own
    assert openmp.others_busy((10.0, 100.0, 3.0), (11.0, 101.5, 3.5)) == 1.0
    assert openmp.others_busy((10.0, 100.0, 3.0), (11.0, 100.4, 3.5)) == 0.0  # never below 0
    start = openmp.reading()
    assert start is None or (start[1] > 0 and start[2] > 0)  # Linux: /proc/stat is read


PROBE = """
import os, sys
import tuneup.trainer.openmp as openmp
looks = iter([(0.0, 10.0, 1.0), (1.0, 11.5, 1.5)])  # others kept 1.0 CPU busy
openmp.reading = lambda: next(looks)
openmp.SHORTEST = 0
class Seen:  # after the command's own finder (it goes first): what torch's import meets
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            print("torch", "torch" in sys.modules, os.environ.get("GOMP_SPINCOUNT"))
            print(os.environ.get(openmp.VARIABLE), flush=True)
            os._exit(0)
sys.meta_path.insert(0, Seen())
sys.argv = ["tuneup", "trainer.max_epochs=1", "hydra.run.dir=" + sys.argv[1]]
from tuneup.cli import main
main()
"""


def _probe(tmp_path, **env):
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(tmp_path / "run")],
        env={"PATH": "/usr/bin:/bin", "HOME": "/tmp", **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_the_command_decides_before_torch_loads_openmp(tmp_path):
    """libgomp reads the variable when torch loads it: the command decides just before."""
    lines = _probe(tmp_path)
    assert lines == [
        "torch False 1000",
        "short spin (GOMP_SPINCOUNT=1000): 1.0 CPU(s) busy with other work when the command "
        "started",
    ]


def test_the_command_keeps_the_shells_spin_count(tmp_path):
    lines = _probe(tmp_path, GOMP_SPINCOUNT="300000")
    assert lines[0] == "torch False 300000"
    assert lines[1] == "the environment's own: GOMP_SPINCOUNT=300000"


def test_the_console_says_when_the_run_started_with_the_short_spin():
    summary = {"status": "ok", "device": "cpu (x86_64, 2 threads)", "world_size": 1}
    short = (
        "short spin (GOMP_SPINCOUNT=1000): 1.4 CPU(s) busy with other work when the command started"
    )
    table = format_table({**summary, "openmp_wait": short})
    assert f"cpu (x86_64, 2 threads), world_size 1, OpenMP {short}" in table
    idle = format_table({**summary, "openmp_wait": "libgomp default: 0.0 CPU(s) busy"})
    assert "OpenMP" not in idle


def test_only_the_cpus_this_process_may_run_on_are_counted():
    stat = (
        "cpu  900 0 300 5000 100 0 0 0 0 0\n"
        "cpu0 100 0 50 2000 10 0 0 0 0 0\n"
        "cpu1 800 0 250 3000 90 0 0 0 0 0\n"
        "intr 12345\n"
    )
    assert openmp.busy_ticks(stat, {0}) == 150
    assert openmp.busy_ticks(stat, {0, 1}) == 1200  # idle and iowait left out
