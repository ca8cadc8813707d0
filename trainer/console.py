"""What the console shows, and what goes only to the run's log file.

The console keeps to what tuneup says (the plan, progress, the summary table), real
warnings, and errors, each warning once. Everything, the console's lines included, goes
to the run's log file (``<run dir>/tuneup.log``): Lightning's banners, every repeat of a
warning, and full tracebacks (Lightning's adverts, "💡 Tip: ...", nowhere). Hydra's ``hydra.job_logging`` (conf/config.yaml)
installs the console handler with :class:`ConsoleFilter`; the log file is opened by
:func:`log_file` once the run owns its directory (tuneup/trainer/runner.py), so a run that
is refused (the directory is another run's) writes nothing there.
"""

from __future__ import annotations

import io
import logging
import os
import re
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from pathlib import Path

#: The run's log file, in its run directory (rank > 0 of a multi-process run: tuneup.rank<N>.log).
LOG_FILE = "tuneup.log"
#: Loggers whose INFO lines the console shows; others' (Lightning's banners) go to the file.
SPOKEN = ("tuneup", "hydra", "__main__")
FORMAT = "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"
#: Lightning's loggers: they print through their own handler unless told to propagate.
LIGHTNING = ("pytorch_lightning", "lightning.pytorch", "lightning_fabric", "lightning.fabric")


#: A library's notices about itself, for the log file only: its own API's deprecations, its
#: optional compiled extensions that do not load here (torchao's "Failed to load ....so"),
#: Lightning's advice to run under srun wherever Slurm's client is installed (tuneup submits
#: to Slurm through hydra/launcher=slurm, and a run outside a job is meant to be one).
#: A captured warning's message begins with where it was raised ("/.../slurm.py:204: ...").
LIBRARY_NOTICE = re.compile(
    r"deprecat|^(?:\S+:\d+: )?(?:Failed to load \S+\.so\b|The `srun` command is available "
    r"on your system)",
    re.IGNORECASE,
)
#: Loggers of tuneup and of the user's own script: their warnings are always shown.
OURS = ("tuneup", "__main__")
#: Loggers that print through their own handler unless told to propagate: Lightning's, and
#: torch's (its warnings, e.g. torchao's deprecation notices at import, would skip the filter).
ROUTED = (*LIGHTNING, "torch")
#: Hydra's line as it launches a sweep's job ("\t#3 : optimizer.lr=0.1").
JOB_LINE = re.compile(r"\s*#\d+ : ")


class ConsoleFilter(logging.Filter):
    """Let through tuneup's and Hydra's INFO lines, and each distinct warning or error once."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[tuple[str, str]] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "file_only", False):
            return False
        if record.name.startswith("hydra") and JOB_LINE.match(record.getMessage()):
            return False  # a sweep's job: its own line says what it ran (trainer/run_report.py)
        if record.levelno < logging.WARNING:
            return record.name.split(".")[0] in SPOKEN
        if record.name.split(".")[0] not in OURS and LIBRARY_NOTICE.search(record.getMessage()):
            return False  # a library's notice about itself: nothing the user can act on
        key = (record.name, record.getMessage())
        if key in self.seen:
            return False
        self.seen.add(key)
        return True


#: How Lightning's adverts for its paid services begin ("💡 Tip: ... try installing litlogger").
ADVERT = "💡 Tip:"


def no_adverts(record: logging.LogRecord) -> bool:
    """Lightning's adverts are kept out of the log file too: nothing there for the user."""
    return not (record.name.startswith(LIGHTNING) and record.getMessage().startswith(ADVERT))


def route_libraries() -> None:
    """Warnings and Lightning's and torch's messages go through logging (so to the file and
    the filter)."""
    logging.captureWarnings(True)
    for name in ROUTED:
        logger = logging.getLogger(name)
        for handler in list(logger.handlers):
            if type(handler) is logging.StreamHandler:  # Lightning's own, made before Hydra's
                logger.removeHandler(handler)
        logger.propagate = True


def say(text: str, logger: logging.Logger) -> None:
    """Tell the user ``text``: through logging (the console and the log file); printed as well
    where nothing shows logging on a console (tuneup.run called from Python)."""
    logger.info("%s", text)
    root = logging.getLogger()
    shown = any(type(h) is logging.StreamHandler for h in root.handlers)
    if not shown and not any(type(h) is logging.StreamHandler for h in logger.handlers):
        print(text, flush=True)


@contextmanager
def file_only(what: str):
    """What is said while active goes to the log file only: a third-party module's import
    (an installed plugin's, and what it imports: transformers' and torchao's notices) prints,
    warns and logs things nothing in the run needs. Printed text (stdout and stderr, Python's
    warnings where they are not captured) is kept and logged once it is done, under ``what``;
    log records below ERROR (captured warnings included) are marked for the file. An error
    stays on the console: an import that fails raises, and the run names it."""
    made = logging.getLogRecordFactory()

    def record(*args, **kwargs) -> logging.LogRecord:
        found = made(*args, **kwargs)
        if found.levelno < logging.ERROR:
            found.file_only = True
        return found

    printed = io.StringIO()
    logging.setLogRecordFactory(record)
    try:
        with redirect_stdout(printed), redirect_stderr(printed):
            yield
    finally:
        logging.setLogRecordFactory(made)
        if text := printed.getvalue().strip():
            logging.getLogger(__name__).info(
                "%s printed:\n%s", what, text, extra={"file_only": True}
            )


def traceback_to_file(logger: logging.Logger, exc: BaseException) -> None:
    """The whole traceback of ``exc`` into the log file only (the console has its one line)."""
    logger.error(
        "the run ended with %s: %s",
        type(exc).__name__,
        exc,
        exc_info=(type(exc), exc, exc.__traceback__),
        extra={"file_only": True},
    )


def process_rank() -> str:
    """This process's rank as its launcher set it: "0" for the first (or only) process."""
    for name in ("RANK", "SLURM_PROCID"):
        if os.environ.get(name, "").isdigit():
            return os.environ[name]
    node, local = os.environ.get("NODE_RANK", "0"), os.environ.get("LOCAL_RANK", "0")
    return "0" if (node, local) in (("0", "0"), ("", "")) else f"{node}-{local}"


def log_file_name() -> str:
    rank = process_rank()
    return LOG_FILE if rank == "0" else f"tuneup.rank{rank}.log"


class RunLog(logging.Handler):
    """This process's log file of the run, appended to; ``held``: the records are kept in
    memory until :meth:`open` (the run took its directory), so that a command refused in a
    directory that holds a run leaves that run's log as it was."""

    def __init__(self, path: Path, held: bool = False) -> None:
        super().__init__()
        self.path, self.file, self.held = path, None, []
        self.addFilter(no_adverts)
        if not held:
            self.open()

    def open(self) -> None:
        if self.file is None:
            self.file = logging.FileHandler(self.path, encoding="utf-8")
            self.file.setFormatter(logging.Formatter(FORMAT))
            for record in self.held:
                self.file.handle(record)
            self.held.clear()

    def emit(self, record: logging.LogRecord) -> None:
        if self.file is None:
            self.held.append(record)
        else:
            self.file.handle(record)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
        self.held.clear()
        super().close()


@contextmanager
def log_file(run_dir: Path, held: bool = False):
    """Everything logged while active is appended to this process's log file of the run
    (``held``: from :meth:`RunLog.open` on, with what was logged before it)."""
    handler = RunLog(Path(run_dir) / log_file_name(), held)
    root = logging.getLogger()
    root.addHandler(handler)
    if root.level > logging.INFO or root.level == logging.NOTSET:
        root.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        handler.close()
