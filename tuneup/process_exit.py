"""How the ``tuneup`` command's process ends: as Python ends it, less the interpreter's teardown.

At exit, Python first waits for the non-daemon threads, runs the ``atexit`` handlers and
flushes the standard streams; then it tears the interpreter down (module globals freed,
C++ static destructors). In that teardown a C++ thread that still holds a tensor reaches for
the GIL: a Gloo worker thread destroying a collective that finished a moment before the run
returned (every DDP and FSDP run on CPU), or a Python callback on its future. Python before
3.14 ends such a thread with a forced unwind, which C++ answers with ``terminate called
without an active exception`` and SIGABRT: exit code 134 after a run that finished and saved
everything, now and then (pytorch/pytorch#190489). :func:`end_process` does the first part
and then leaves with :func:`os._exit`, so there is no teardown to race with.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
from typing import NoReturn


def exit_code(code: object) -> int:
    """The status ``sys.exit(code)`` gives: None is 0, an int itself, anything else printed, 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def run_exit_handlers() -> None:
    """What Python does at exit before its teardown: join the non-daemon threads (and stop
    ``concurrent.futures`` executors), run the ``atexit`` handlers, flush stdout and stderr."""
    shutdown = getattr(threading, "_shutdown", None)  # Py_FinalizeEx calls it first, 3.8-3.14
    if shutdown is not None:
        shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            stream.flush()


def end_process(code: object) -> NoReturn:
    """End the process with ``sys.exit(code)``'s status, without the interpreter's teardown."""
    status = exit_code(code)
    run_exit_handlers()
    os._exit(status)


#: multiprocessing runs its exit finalizers from the highest priority to the lowest: this one
#: after all of them (its queues' feeder threads, joined at -5, the last of its own).
_LAST = -(2**62)


def end_worker_as_command() -> None:
    """In a joblib (loky) worker process: once its loop of jobs has ended (the command shut
    its workers down at exit, or one sat idle past loky's timeout), the process ends as
    :func:`end_process` ends the command. The command joins its workers at exit; were each to
    go through the interpreter's teardown (the garbage collection of torch's and Lightning's
    modules), the command would wait on it after its sweep had ended.

    Hooked as multiprocessing's last exit finalizer, which the worker runs once its loop has
    returned, after multiprocessing's own (its queues flushed, its children joined). A loop
    that returned is exit status 0, as multiprocessing gives it; one that raised ends the
    usual way. What a process runs at exit still runs: its non-daemon threads are joined, its
    ``atexit`` handlers run (torch's compile workers are shut down by one), its stdout and
    stderr are flushed; what is left out is what the command leaves out, the teardown.
    Anywhere else (the command's own process, a run's other processes): nothing."""
    from multiprocessing import current_process, util

    loky = sys.modules.get("joblib.externals.loky.backend.process")
    worker = current_process()
    if loky is None or not isinstance(worker, loky.LokyProcess):
        return
    if getattr(worker, "_tuneup_ends_as_command", False):
        return
    worker._tuneup_ends_as_command = True
    util.Finalize(None, _end_worker, args=(os.getpid(),), exitpriority=_LAST)


def _end_worker(pid: int) -> None:
    """The worker's end; not in a process a job forked off it (os.fork keeps the finalizers),
    whose own exit status stays its own."""
    if os.getpid() == pid and sys.exc_info()[0] is None:  # the loop returned: status 0
        end_process(0)
