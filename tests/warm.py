"""Warm starts for the command-line tests: ``python run.py ...`` without paying the 5 s import.

Most of this suite's time went into importing torch and Lightning (about 5.5 CPU-seconds on
this project's 2-core machines) once for every Python process the tests start: some 120. A
*zygote* imports those third-party libraries once (``python tests/warm.py serve SOCKET EXE``);
the tests then start ``python tests/warm.py SOCKET run.py ARGS`` instead of
``python run.py ARGS``. That client imports nothing heavy: it sends its argv, working
directory, environment and its open descriptors (stdin/stdout/stderr, and any pipe it was
given) to the zygote, which forks a child that becomes ``python run.py ARGS``: sys.argv,
sys.path with the client's PYTHONPATH, the environment, the working directory, the
descriptors under their numbers and none of the zygote's, ``__main__``, default signal
handlers, fresh random seeds, the threads ``OMP_NUM_THREADS`` asks for, and the exit (threads
joined, atexit run, streams flushed). The client forwards the signals it gets to the child and
ends the way the child ended: the same exit code, or killed by the same signal. If the client
is killed (SIGKILL cannot be forwarded), the zygote kills the child.

The child also takes the client's CPU affinity (taskset, a Slurm task's binding) and umask.
In the children ``sys.executable`` is ``EXE``, a script that runs the client, so what a run
starts as ``python [-u] [-B] script`` or ``python -m`` one of :data:`MODULES` (DDP ranks,
joblib's workers, submitit's Slurm jobs under srun) starts warm too. Cold, as real
interpreters: anything else (``-c``, other interpreter options, other modules: Inductor's
workers), a command whose environment differs from the zygote's in what the imports read
(:data:`IMPORT_TIME`: Triton's interpreter switch...), everything when an import loaded
CUDA's driver, and everything under ``TUNEUP_TEST_COLD=1``. ``TUNEUP_WARM_LOG=FILE`` writes
a line per command: warm, or cold and why. tuneup itself and the user's code are never
preloaded: the child imports them from its own sys.path, so an installed copy or a user's
project is what runs. tests/test_warm.py holds a warm start to a fresh interpreter.

Only the standard library is imported in client mode (it must start in milliseconds).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import struct
import sys

#: Imported once by the zygote: the third-party libraries a run imports (not tuneup).
PRELOAD = ("torch", "pytorch_lightning", "torchmetrics", "hydra", "omegaconf", "pluggy")

#: Imported too where installed: what each run of a Hugging Face model imports (transformers'
#: model base, 0.4 CPU-s a run; torchmetrics has imported transformers itself already).
PRELOAD_IF_INSTALLED = ("transformers.modeling_utils",)

#: Modules a warm start may run with ``-m``: tuneup's own, and what the launchers start with
#: ``sys.executable``: loky's process workers (Hydra's joblib launcher), and submitit's job
#: (``python -u -m submitit.core._submit FOLDER`` under srun: hydra/launcher=slurm).
MODULES = (
    "tuneup",
    "tuneup.consolidate",
    "joblib.externals.loky.backend.popen_loky_posix",
    "submitit.core._submit",
)

#: Interpreter options a warm start can honour: unbuffered streams, no bytecode written.
OPTIONS = ("-u", "-B")

#: Descriptors one message can pass (SCM_MAX_FD); a command holding more runs cold.
MAX_FDS = 253

#: Signals a client passes on to its child (SIGKILL and SIGSTOP cannot be caught).
FORWARDED = (
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGALRM,
    signal.SIGCONT,
)

#: Environment read when the preloaded libraries are imported (Triton's interpreter switch,
#: torch's and Inductor's settings, Hugging Face's hub and cache, the interpreter's options):
#: a command whose values differ from the zygote's runs cold, as a fresh interpreter. Honoured
#: in the child:
#: PYTHONPATH, PYTHONUNBUFFERED, PYTHONDONTWRITEBYTECODE, the thread counts
#: (torch.set_num_threads from OMP_NUM_THREADS sets MKL's too; joblib sets both for its
#: workers), and KMP_INIT_AT_FORK (joblib's import sets it; Intel's OpenMP reads it when the
#: process forks, and a child of the zygote has it before it can fork).
IMPORT_TIME = (
    "TRITON_",
    "TORCH",
    "PYTORCH_",
    "CUDA_",
    "NCCL_",
    "MKL_",
    "KMP_",
    "PYTHON",
    "HF_",
    "TRANSFORMERS_",
)
HONOURED = (
    "PYTHONPATH",
    "PYTHONUNBUFFERED",
    "PYTHONDONTWRITEBYTECODE",
    "MKL_NUM_THREADS",
    "KMP_INIT_AT_FORK",
)

_LEN = struct.Struct("!I")


# --- the client: what the tests start ---------------------------------------------------------


def client(path: str, argv: list[str]) -> None:
    """Run ``argv`` (:data:`OPTIONS`, then a script or ``-m module`` and its arguments) in a
    child of the zygote at ``path``; end as it ended."""
    options, command = _split_options(argv)
    if not _warm_shape(command):
        _cold(argv)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
    except OSError:  # the zygote is gone (its worker ended, or it died): start cold
        _cold(argv, "no zygote")
    fds = _open_fds(conn.fileno())
    if len(fds) > MAX_FDS:
        conn.close()
        _cold(argv, f"more than {MAX_FDS} descriptors")
    request = {
        "options": options,
        "argv": command,
        "cwd": os.getcwd(),
        "env": dict(os.environ),
        "fds": fds,
        "cpus": sorted(os.sched_getaffinity(0)),
        "umask": _umask(),
        "ignored": _ignored_signals(),
    }
    data = json.dumps(request).encode()
    socket.send_fds(conn, [_LEN.pack(len(data)) + data], fds)
    reader = conn.makefile("r")
    answer = reader.readline().strip()
    if answer.startswith("cold"):  # the zygote's imports do not fit this environment
        conn.close()
        _cold(argv, answer[len("cold ") :])
    child = int(answer)
    _log("warm", argv)

    def forward(signum, _frame):
        os.kill(child, signum)

    for signum in FORWARDED:
        signal.signal(signum, forward)
    kind, value = reader.readline().split()  # "exit N" or "signal N"
    if kind == "signal":
        if int(value) in FORWARDED:
            signal.signal(int(value), signal.SIG_DFL)
        os.kill(os.getpid(), int(value))
    os._exit(int(value) if kind == "exit" else 1)


def _cold(argv: list[str], why: str = "not a script or a warm module") -> None:
    """Become ``python ARGV`` itself: a fresh interpreter."""
    _log(f"cold ({why})", argv)
    os.execv(sys.executable, [sys.executable, *argv])


def _log(how: str, argv: list[str]) -> None:
    """``TUNEUP_WARM_LOG=FILE``: a line per command, how it started (why cold, if it was)."""
    if os.environ.get("TUNEUP_WARM_LOG"):
        with open(os.environ["TUNEUP_WARM_LOG"], "a") as log:
            log.write(f"{how}: {' '.join(argv)}\n")


def _ignored_signals() -> list[int]:
    """The signals this process was started with ignored (``nohup``, a background job of a
    non-interactive shell: SIGINT, SIGQUIT), and the two Python itself ignores (SIGPIPE,
    SIGXFSZ). A fresh interpreter keeps an inherited SIG_IGN, Ctrl-C's SIGINT included."""
    ignored = []
    for signum in range(1, signal.NSIG):
        with contextlib.suppress(OSError, ValueError):
            if signal.getsignal(signum) is signal.SIG_IGN:
                ignored.append(signum)
    return ignored


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _split_options(argv: list[str]) -> tuple[list[str], list[str]]:
    """(the leading :data:`OPTIONS`, the rest)."""
    count = next((i for i, arg in enumerate(argv) if arg not in OPTIONS), len(argv))
    return argv[:count], argv[count:]


def _warm_shape(argv: list[str]) -> bool:
    """A script and its arguments or ``-m`` one of :data:`MODULES` (after :data:`OPTIONS`):
    what a warm start can be. Anything else (other interpreter options, ``-c``, other modules:
    Inductor's compile workers) runs cold."""
    if argv[:1] == ["-m"]:
        return len(argv) > 1 and argv[1] in MODULES
    return bool(argv) and not argv[0].startswith("-") and os.path.isfile(argv[0])


def _open_fds(exclude: int) -> list[int]:
    """The descriptors this process holds (those it was started with): the child gets them
    under the same numbers (joblib's workers read their parent's pipes by number)."""
    found = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        with contextlib.suppress(OSError):  # the listing's own descriptor is closed by now
            if fd != exclude and os.fstat(fd):
                found.append(fd)
    return sorted(found)


# --- the zygote ----------------------------------------------------------------------------


def serve(path: str, executable: str) -> None:
    """Import :data:`PRELOAD`, then fork a child for every client that connects."""
    zygote = Zygote(executable)
    zygote.listener.bind(path)
    zygote.listener.listen(64)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    children = zygote.children
    try:
        while True:
            ready, _, _ = select.select([zygote.listener, *children.values()], [], [], 0.05)
            for conn in ready:
                if conn is zygote.listener:
                    zygote.start(zygote.listener.accept()[0])
                else:  # a client went away before its child ended: it was killed
                    pid = next(p for p, c in children.items() if c is conn)
                    _kill(pid)
            _reap(children)
    finally:
        for pid in children:
            _kill(pid)
        import gc

        gc.unfreeze()  # the interpreter's end frees what is frozen (Triton's bindings list it)


class Zygote:
    """What the children start from: the preloaded imports and what they did to the process.

    In the children ``sys.executable`` is ``executable``, a script that starts this module's
    client: the processes a run starts itself as ``python script`` (DDP ranks) start warm too.
    """

    def __init__(self, executable: str) -> None:
        import gc
        import importlib.util

        self.executable = executable
        self.seen = dict(os.environ)  # the environment the imports saw
        own_pythonpath = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        self.base_path = [p for p in sys.path[1:] if p not in own_pythonpath]
        gc.disable()  # during the imports: each collection walks all imported so far
        for name in PRELOAD:
            importlib.import_module(name)
        for name in PRELOAD_IF_INSTALLED:
            if importlib.util.find_spec(name.partition(".")[0]) is not None:
                importlib.import_module(name)
        _parse_configs()
        _freeze()
        gc.enable()
        #: what the imports set in os.environ (Lightning: PYTORCH_NVML_BASED_CUDA_CHECK, ...):
        #: a fresh interpreter's imports would set it too, where the command's does not
        self.set_by_imports = {k: v for k, v in os.environ.items() if self.seen.get(k) != v}
        # CUDA cannot be used in a fork of a process that initialised it: if an import did
        # (the driver's or NVML's library is loaded), every command runs cold.
        with open("/proc/self/maps") as maps:
            self.cold = any("libcuda.so" in line or "libnvidia-ml" in line for line in maps)
        self.read = self.read_by_imports(self.seen)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.children: dict[int, socket.socket] = {}  # pid -> the client's connection

    def read_by_imports(self, environment: dict) -> dict:
        """The part of ``environment`` the preloaded imports read (:data:`IMPORT_TIME`)."""
        return {
            k: v
            for k, v in environment.items()
            if k.startswith(IMPORT_TIME) and k not in HONOURED and self.set_by_imports.get(k) != v
        }

    def misfit(self, env: dict) -> str:
        """Why the imports would not have gone the same way under the command's ``env``
        (the variables that differ), or ""."""
        if self.cold:
            return "CUDA's driver is loaded"
        theirs = self.read_by_imports(env)
        return " ".join(
            sorted(k for k in {*theirs, *self.read} if theirs.get(k) != self.read.get(k))
        )

    def start(self, conn: socket.socket) -> None:
        head, fds, _, _ = socket.recv_fds(conn, _LEN.size, MAX_FDS)
        (size,) = _LEN.unpack(head)
        data = b""
        while len(data) < size:
            data += conn.recv(size - len(data))
        request = json.loads(data)
        misfit = self.misfit(request["env"])
        if misfit:
            for fd in fds:
                os.close(fd)
            conn.sendall(f"cold {misfit}\n".encode())
            conn.close()
            return
        sys.stdout.flush()
        sys.stderr.flush()
        _freeze()  # and what the zygote made since
        pid = os.fork()
        if pid == 0:
            try:
                for own in (conn, self.listener, *self.children.values()):
                    own.detach()  # closed below, with every descriptor of the zygote's
                env = {**self.set_by_imports, **request["env"]}
                received = dict(zip(request["fds"], fds, strict=True))
                _become(request, env, received, self)  # ends the process
            finally:
                os._exit(1)
        for fd in fds:
            os.close(fd)
        conn.sendall(f"{pid}\n".encode())
        self.children[pid] = conn


def _parse_configs() -> None:
    """The checkout's conf/ and Hydra's own parsed before the forks, and each child's
    compositions reuse them (tests/parsed_configs.py: keyed by a file's text, so a user's
    folder, an edited file or an installed copy is read as it is)."""
    from pathlib import Path

    import hydra
    import parsed_configs  # beside this script: sys.path[0]

    parsed_configs.install()
    parsed_configs.preload(Path(__file__).resolve().parents[1] / "conf")
    parsed_configs.preload(Path(hydra.__file__).resolve().parent / "conf")


def _freeze() -> None:
    """Move every object alive into the collector's permanent generation (Python's advice
    before a server forks): a child's collections never walk them, nor copy their pages. A
    tiny run's child: 0.26-0.27 CPU-s with it, 0.30-0.41 without (some children's first full
    collection walked the 460 thousand objects the imports had made)."""
    import gc

    gc.collect()
    gc.freeze()


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _reap(children: dict) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is None:
            continue
        if os.WIFSIGNALED(status):
            message = f"signal {os.WTERMSIG(status)}\n"
        else:
            message = f"exit {os.waitstatus_to_exitcode(status)}\n"
        with contextlib.suppress(OSError):
            conn.sendall(message.encode())
        conn.close()


# --- the child: becomes ``python ARGV`` ------------------------------------------------------


def _become(request: dict, env: dict, received: dict, zygote: Zygote) -> None:
    """Turn this fork of the zygote into the interpreter the client was asked to be."""
    import fcntl

    # the client's descriptors under their numbers, and none of the zygote's
    top = max([2, *received, *received.values()]) + 1  # above every number in play
    moved = {number: fcntl.fcntl(fd, fcntl.F_DUPFD, top) for number, fd in received.items()}
    for name in os.listdir("/proc/self/fd"):
        if int(name) not in moved.values():
            with contextlib.suppress(OSError):
                os.close(int(name))
    for number, fd in moved.items():
        os.dup2(fd, number)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(env)
    os.sched_setaffinity(0, request["cpus"])  # the CPUs the client may use (taskset, Slurm)
    os.umask(request["umask"])
    options, argv = request["options"], request["argv"]
    sys.orig_argv = [zygote.executable, *options, *argv]
    ignored = set(request["ignored"])
    for signum in range(1, signal.NSIG):  # as a fresh interpreter started by the client has them
        if signum in (signal.SIGKILL, signal.SIGSTOP):
            continue
        with contextlib.suppress(OSError, ValueError):
            signal.signal(signum, signal.SIG_IGN if signum in ignored else signal.SIG_DFL)
    if signal.SIGINT not in ignored:  # Python raises KeyboardInterrupt unless it was ignored
        signal.signal(signal.SIGINT, signal.default_int_handler)
    unbuffered = "-u" in options or bool(os.environ.get("PYTHONUNBUFFERED"))
    sys.dont_write_bytecode = "-B" in options or bool(os.environ.get("PYTHONDONTWRITEBYTECODE"))
    sys.stdout.reconfigure(write_through=unbuffered)
    sys.stderr.reconfigure(write_through=unbuffered, line_buffering=True)
    sys.executable = zygote.executable
    code = _run(argv, zygote.base_path)
    os._exit(code)


def _run(argv: list[str], base_path: list[str]) -> int:
    import importlib
    import random
    import runpy

    import numpy
    import torch

    from tuneup.process_exit import exit_code, run_exit_handlers

    random.seed()
    numpy.random.seed()
    threads = os.environ.get("OMP_NUM_THREADS", "")
    torch.set_num_threads(int(threads) if threads.isdigit() and int(threads) > 0 else _cpus())
    pythonpath = [
        os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p
    ]
    module = argv[1] if argv[0] == "-m" else None
    first = os.getcwd() if module else os.path.dirname(os.path.abspath(argv[0]))
    sys.path[:] = [first, *pythonpath, *base_path]
    importlib.invalidate_caches()
    sys.argv = [argv[0] if module is None else module, *argv[2 if module else 1 :]]
    code = 0
    try:
        if module:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as stop:
        code = exit_code(stop.code)
    except KeyboardInterrupt:
        run_exit_handlers()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    run_exit_handlers()  # as the tuneup command ends (run.py and -m tuneup end so themselves)
    return code


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(sys.argv[2], sys.argv[3])
    else:
        client(sys.argv[1], sys.argv[2:])
