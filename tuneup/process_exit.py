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
