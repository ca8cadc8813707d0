"""The warm start (tests/warm.py) that the command-line tests use is the interpreter a user's
``python script.py`` would be, in everything those tests look at."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import python

pytestmark = pytest.mark.skipif(
    bool(os.environ.get("TUNEUP_TEST_COLD")),
    reason="TUNEUP_TEST_COLD=1: no zygote, every command is cold",
)

SCRIPT = """
    import gc, json, os, signal, sys

    import torch

    import helper  # from PYTHONPATH, a folder the zygote never saw

    if sys.argv[1] == "unbuffered":  # python -u: written at once, not lost by os._exit
        print("written")
        os._exit(0)
    umask = os.umask(0)
    print(json.dumps({
        "name": __name__, "argv": sys.argv, "cwd": os.getcwd(), "path0": sys.path[0],
        "helper": helper.__file__, "asked": os.environ.get("ASKED"),
        "threads": torch.get_num_threads(), "stdin": sys.stdin.read(),
        "cpus": sorted(os.sched_getaffinity(0)), "umask": umask, "gc": gc.isenabled(),
    }))
    print("to stderr", file=sys.stderr)
    if sys.argv[1] == "signal":
        os.kill(os.getpid(), signal.SIGTERM)
    raise SystemExit(int(sys.argv[1]))
"""


def start(prefix, script, tmp_path, how):
    """``PREFIX SCRIPT HOW`` on CPU 0 only (as under taskset or a Slurm task's binding), with
    umask 027."""
    env = {
        **os.environ,
        "PYTHONPATH": str(tmp_path / "lib"),
        "ASKED": "yes",
        "OMP_NUM_THREADS": "1",
    }
    env.pop("PYTHONUNBUFFERED", None)  # buffered unless -u
    return subprocess.run(
        [*prefix, str(script), how],
        cwd=tmp_path,
        env=env,
        input="fed",
        capture_output=True,
        text=True,
        timeout=120,
        umask=0o027,
        preexec_fn=lambda: os.sched_setaffinity(0, {0}),
    )


def test_a_warm_start_is_the_script_run_by_a_fresh_interpreter(tmp_path):
    script = tmp_path / "bin" / "probe.py"
    script.parent.mkdir()
    script.write_text(textwrap.dedent(SCRIPT))
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "helper.py").write_text("")
    cold = start([sys.executable], script, tmp_path, "3")
    warm = start(python(), script, tmp_path, "3")
    assert cold.returncode == warm.returncode == 3, warm.stderr
    assert (
        json.loads(warm.stdout)
        == json.loads(cold.stdout)
        == {
            "name": "__main__",
            "argv": [str(script), "3"],
            "cwd": str(tmp_path),
            "path0": str(script.parent),
            "helper": str(tmp_path / "lib" / "helper.py"),
            "asked": "yes",
            "threads": 1,
            "stdin": "fed",
            "cpus": [0],
            "umask": 0o027,
            "gc": True,  # the zygote imported with it off (tests/warm.py)
        }
    )
    assert warm.stderr == cold.stderr == "to stderr\n"
    killed = start(python(), script, tmp_path, "signal")
    assert killed.returncode == -signal.SIGTERM and killed.stderr == "to stderr\n"
    for prefix in ([sys.executable, "-u"], [*python(), "-u"]):  # submitit's jobs: python -u -m
        unbuffered = start(prefix, script, tmp_path, "unbuffered")
        assert (unbuffered.returncode, unbuffered.stdout) == (0, "written\n"), unbuffered.stderr


def test_commands_a_warm_start_cannot_be_run_cold(tmp_path):
    """``-c``, other interpreter options and modules, and an environment the zygote's imports
    did not see (Triton's interpreter) are real interpreters."""
    done = subprocess.run(
        [*python(), "-c", "import sys; print(sys.argv)"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and done.stdout == "['-c']\n"
    script = tmp_path / "which.py"
    script.write_text("import os, sys; print('torch' in sys.modules)\n")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    cold = subprocess.run([*python(), str(script)], env=env, capture_output=True, text=True)
    warm = subprocess.run([*python(), str(script)], capture_output=True, text=True)
    warm_options = subprocess.run(
        [*python(), "-u", "-B", str(script)], capture_output=True, text=True
    )
    assert (cold.stdout, warm.stdout, warm_options.stdout) == ("False\n", "True\n", "True\n")


@pytest.mark.parametrize("sigint", ["ignored", "default"])
def test_signals_ignored_by_the_starting_process_stay_ignored(tmp_path, sigint):
    """A background job of a non-interactive shell starts with SIGINT and SIGQUIT ignored, and
    a fresh interpreter keeps that (Ctrl-C does not reach it); otherwise Ctrl-C raises
    KeyboardInterrupt. A warm start is the same."""
    script = tmp_path / "dispositions.py"
    script.write_text(
        "import signal\n"
        "print([signal.getsignal(s) for s in (signal.SIGINT, signal.SIGQUIT, signal.SIGPIPE,"
        " signal.SIGXFSZ, signal.SIGTERM)])\n"
    )

    def as_started():
        handler = signal.SIG_IGN if sigint == "ignored" else signal.SIG_DFL
        signal.signal(signal.SIGINT, handler)
        signal.signal(signal.SIGQUIT, handler)

    cold, warm = [
        subprocess.run(
            [*prefix, str(script)],
            capture_output=True,
            text=True,
            timeout=120,
            preexec_fn=as_started,
        )
        for prefix in ([sys.executable], python())
    ]
    ignored = "<Handlers.SIG_IGN: 1>"
    first = ignored if sigint == "ignored" else "<built-in function default_int_handler>"
    second = ignored if sigint == "ignored" else "<Handlers.SIG_DFL: 0>"
    expected = f"[{first}, {second}, {ignored}, {ignored}, <Handlers.SIG_DFL: 0>]\n"
    assert cold.stdout == warm.stdout == expected, (cold.stderr, warm.stderr)


def test_descriptors_arrive_under_their_numbers_and_only_those(tmp_path):
    """What joblib's workers rely on: a pipe passed by number; and nothing of the zygote's."""
    script = tmp_path / "fds.py"
    script.write_text(
        "import os, sys\n"
        "os.write(int(sys.argv[1]), b'through the pipe')\n"
        "def is_open(fd):\n"
        "    try:\n"
        "        return bool(os.fstat(fd))\n"
        "    except OSError:\n"
        "        return False\n"
        "print(sorted(fd for fd in map(int, os.listdir('/proc/self/fd')) if is_open(fd)))\n"
    )
    read, write = os.pipe()
    try:
        done = subprocess.run(
            [*python(), str(script), str(write)],
            pass_fds=(write,),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        assert os.read(read, 100) == b"through the pipe"
        assert done.stdout == f"{[0, 1, 2, write]}\n"
    finally:
        os.close(read)
        os.close(write)
