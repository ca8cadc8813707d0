"""A resumed run trains with its own settings: the overrides it recorded, the command line's on top.

A run records the command-line overrides it was started with in
``<run dir>/.hydra/overrides.yaml`` (trainer/state/run_dir.py ``write_record``). A job
script or a person continuing it types ``resume=auto hydra.run.dir=<run dir>``, as the
docs show, usually without the rest: composed from the defaults alone, a run started with
``trainer.max_epochs=8`` and killed with ``-9`` in epoch 4 was "complete" at the default
``max_epochs=3`` and trained nothing (or a ``model=gpt`` run was refused: its weights do
not fit the default model). SIGTERM's printed command carried every override; a hard crash
prints nothing.

So before Hydra composes (tuneup/cli.py), :func:`with_saved_overrides` puts the run's
recorded overrides in front of the command line's own, which Hydra applies after them, so
that what is typed now wins. Not taken: ``resume`` and ``resume_weights_only`` (how this
session starts), Hydra's own keys, a saved key the command line sets again, and the saved
keys under a group the command line chooses anew (``model=mlp`` drops the saved
``model.layers=1``). Only for ``resume=auto`` or ``resume=<path>`` (not a weights-only
start, which is a new run with settings of its own), and not in a sweep. The console says
which overrides were taken. The merged list is this session's record in turn, and what
the processes a launcher starts are given.

The run directory is ``hydra.run.dir`` as given; without it, in a Slurm job (a job script:
``outputs/<SLURM_JOB_ID>``), the config is composed once to find it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

#: Keys a resumed run never takes from its record: they say how this session starts.
NOT_TAKEN = ("resume", "resume_weights_only")
#: Where a run records its overrides, relative to its run directory.
RECORD = Path(".hydra") / "overrides.yaml"


def with_saved_overrides(argv: list[str]) -> tuple[list[str], Path | None, list[str]]:
    """``argv`` with the run's recorded overrides before its own; the record read and the
    overrides taken from it (none: ``argv`` unchanged)."""
    parsed = _command_line(argv)
    if parsed is None:
        return argv, None, []
    args, given = parsed
    if args.multirun or not _resumes(given):
        return argv, None, []
    run_dir = _value(given, "hydra.run.dir") or _composed_run_dir(args.overrides)
    record = Path(str(run_dir)) / RECORD if run_dir else None
    if record is None or not record.is_file():
        return argv, None, []
    try:
        from omegaconf import OmegaConf

        saved = [str(o) for o in OmegaConf.load(record)]
        taken = [o.input_line for o in _parse(saved) if _taken(o, given)]
    except Exception:  # a record that does not parse: the command line as it is
        return argv, record, []
    if not taken:
        return argv, record, []
    at = _start(argv, args.overrides)
    return [*argv[:at], *taken, *argv[at:]], record, taken


def _command_line(argv: list[str]):
    """Hydra's reading of ``argv``: its arguments and the parsed overrides; None where it
    refuses them (Hydra will say what is wrong with the command line)."""
    from hydra._internal.utils import get_args_parser

    try:
        args = get_args_parser().parse_args(argv)
        return args, _parse(args.overrides)
    except (Exception, SystemExit):
        return None


def nothing_to_resume(argv: list[str]) -> str | None:
    """The error for ``resume=auto hydra.run.dir=<dir>`` alone where ``<dir>`` does not exist:
    no run to continue, and nothing on the command line to start one with, so it would train
    the default model in a new directory (a typo of the run's directory, most likely, which
    the line names). A job script's first start gives its settings beside ``resume=auto``, as
    overrides or as a config of its own (``--config-name``, ``--config-dir``)."""
    parsed = _command_line(argv)
    if parsed is None:
        return None
    args, given = parsed
    run_dir = _value(given, "hydra.run.dir")
    own = [o for o in given if o.key_or_group not in NOT_TAKEN]
    own = [o for o in own if not o.key_or_group.startswith(("hydra.", "hydra/"))]
    own_config = args.config_name or args.config_dir or args.config_path  # settings in a file
    if args.multirun or _value(given, "resume") != "auto" or run_dir is None or own or own_config:
        return None
    path = Path(str(run_dir))
    if path.exists():
        return None
    return (
        f"resume=auto hydra.run.dir={run_dir}: {path} does not exist, so there is no run to "
        "continue, and nothing else on the command line says what to train (it would train "
        f"the default model); give the directory of the run to continue{_near(path)}, or the "
        "run's settings to start it there"
    )


def _near(path: Path) -> str:
    """`` (did you mean <sibling>?)`` for a directory beside ``path`` with a name close to it."""
    from tuneup.trainer.typos import did_you_mean

    parent = path.parent if str(path.parent) else Path(".")
    try:
        siblings = [p.name for p in parent.iterdir() if p.is_dir()]
    except OSError:
        return ""
    match = did_you_mean(path.name, siblings)
    return "" if match is None else f" (did you mean hydra.run.dir={parent / match}?)"


def announce(record: Path, taken: list[str]) -> None:
    """One line on the console (the first process only) naming the overrides taken."""
    from tuneup.trainer.console import process_rank

    if taken and process_rank() == "0":
        print(
            f"resuming with this run's own settings from {record}: {' '.join(taken)} (the "
            "command line's own go on top)",
            flush=True,
        )


def _parse(overrides: list[str]) -> list:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create().parse_overrides(overrides)


def _value(overrides: list, key: str):
    """The value the last override of ``key`` gives it, or None."""
    found = [o for o in overrides if o.key_or_group == key and o.package is None]
    return found[-1].value() if found else None


def _resumes(overrides: list) -> bool:
    """Whether the command continues a run: resume=auto or a path, not a weights-only start."""
    return (
        _value(overrides, "resume") not in (None, "null")
        and _value(overrides, "resume_weights_only") is not True
    )


def _taken(saved, given: list) -> bool:
    """Whether a recorded override goes into this session (see the module docstring)."""
    from hydra.core.override_parser.types import OverrideType

    key = saved.key_or_group
    if key in NOT_TAKEN or key.startswith(("hydra.", "hydra/")) or key == "hydra":
        return False
    for o in given:
        if o.key_or_group == key and o.package == saved.package:
            # a saved '+key' that the command line changes: kept, so the key exists to change
            return saved.type in (OverrideType.ADD, OverrideType.FORCE_ADD) and (
                o.type == OverrideType.CHANGE
            )
        if (
            o.type == OverrideType.CHANGE
            and "." not in o.key_or_group
            and (key.startswith(f"{o.key_or_group}."))
        ):
            return False  # a group chosen anew starts from its option's own values
    return True


def _start(argv: list[str], overrides: list[str]) -> int:
    """Where the overrides begin in ``argv`` (after Hydra's flags before them)."""
    n = len(overrides)
    for i in range(len(argv) - n + 1):
        if argv[i : i + n] == overrides:
            return i
    return len(argv) - n


def _composed_run_dir(overrides: list[str]) -> str | None:
    """``hydra.run.dir`` of the config these overrides compose (a Slurm job: outputs/<job
    id>); None when it is a new directory of this moment's time, or cannot be composed."""
    if not os.environ.get("SLURM_JOB_ID"):
        return None  # the default is a new directory (the date and time): nothing recorded
    try:
        from hydra import compose, initialize_config_module

        from tuneup.trainer import config
        from tuneup.trainer.hookspecs import PROJECT

        with initialize_config_module(config_module=f"{PROJECT}.conf", version_base="1.3"):
            config.register()
            cfg = compose("config", overrides=overrides, return_hydra_config=True)
            return str(cfg.hydra.run.dir)
    except Exception as exc:
        print(
            f"warning: could not find this run's directory to take its recorded settings "
            f"({type(exc).__name__}); pass hydra.run.dir=<run dir>",
            file=sys.stderr,
        )
        return None
