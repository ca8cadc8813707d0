"""The user's own command, checked before the autotune launches or writes anything.

A single run refuses a bad config before it builds anything (trainer/runner.py: the core's
checks and every plugin's ``check``). The autotune's baseline job would refuse it too, but
only after the sweep directory, the study's journal and a job folder exist, and the job's
refusal would be printed and then the sweeper's. So the sweeper composes the user's command
as the baseline job gets it and checks it with the same machinery it uses for candidates
(space.Checks: Hydra's loader, ``Plan``, the plugins' checks; nothing is trained), and, for
the time-to-target study, parses the command line's sweeps (the space's checks:
tuneup/optuna/space_checks.py); ``autotune.params`` are checked with the other settings.
"""

from __future__ import annotations

from tuneup import TuneupError
from tuneup.autotune.race import required_target


def check_command(checks, sweeps: list[str], study: bool) -> None:
    """Raise a one-line :class:`TuneupError` for what the baseline job would refuse, or for a
    sweep Optuna could not sample. ``checks``: space.Checks on the user's command with the
    trial's settings; ``study``: autotune.objective=time_to_target."""
    if study:
        required_target(checks)  # its own advice first: the target's checks ask for one
        from tuneup.optuna.space import parse_space

        parse_space(None, sweeps)
    inspection = checks.inspect(())
    if not inspection.ok:
        raise TuneupError("your command: " + "; ".join(inspection.problems))
