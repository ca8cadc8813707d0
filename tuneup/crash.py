"""A run's failure on the console in one line: what, where it was raised (the user's own frame
when that was in a library), at which step, and which process; the whole traceback stays in
the run's log file, and reaches the console too with ``HYDRA_FULL_ERROR=1`` (Hydra's own
switch)."""

from __future__ import annotations

import os
import sys

from tuneup import PROJECT


def crash_line(exc: BaseException) -> str:
    """An exception that is no config error (the user's model, a library) in one line: what,
    where it was raised (and the user's own frame when that was in a library), at which step,
    and the log file that holds the whole traceback."""
    import traceback

    frames = list(traceback.walk_tb(exc.__traceback__))
    message = str(exc).strip().splitlines()
    text = type(exc).__name__ + (
        f": {message[0]}" + (" ..." if len(message) > 1 else "") if message else ""
    )
    if frames:
        text += f", raised in {_frame(*frames[-1])}"
        own = [f for f in frames if not _is_library(f[0])]
        if own and own[-1] is not frames[-1] and _is_library(frames[-1][0]):
            text += f", called from {_frame(*own[-1])}"
    step = getattr(exc, "tuneup_step", None)
    if step is not None:
        text += f" at step {step}"
    logged = getattr(exc, "tuneup_log", None)
    if logged is not None:
        text += f"; the traceback is in {logged} (on the console too with HYDRA_FULL_ERROR=1)"
    return text


def _frame(frame, line: int) -> str:
    return f"{frame.f_globals.get('__name__', '?')} (line {line}, in {frame.f_code.co_name})"


def _is_library(frame) -> bool:
    """Whether a frame is in an installed library, the standard library or tuneup itself,
    rather than in the user's own code."""
    import sysconfig

    name, path = frame.f_globals.get("__name__", ""), frame.f_code.co_filename
    roots = {sysconfig.get_paths()[k] for k in ("purelib", "platlib", "stdlib", "platstdlib")}
    return name.split(".")[0] == PROJECT or any(path.startswith(r) for r in roots if r)


def show_traceback_if_asked(exc: BaseException) -> None:
    """The whole traceback of a one-line error on the console too, with HYDRA_FULL_ERROR=1
    (Hydra's own switch for full tracebacks); it is always in the run's log file."""
    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        import traceback

        traceback.print_exception(exc, file=sys.stderr)


def rank_prefix(exc: BaseException) -> str:
    """'rank N: ' when the run had several processes: its error must say which one failed."""
    rank = getattr(exc, "tuneup_rank", None)
    return "" if rank is None else f"rank {rank}: "
