"""A command-line override that does not parse, in one line: what is wrong and how to quote it.

Hydra refuses ``resume=a#b.ckpt`` (or ``resume=a.ckpt b.ckpt``, two arguments) with its
parser's exception, a caret under the character and a link to its grammar. The command
(tuneup/cli.py) checks the overrides with Hydra's own parser before composing and prints
one ``error:`` line from here instead, naming the key, the character or argument that does
not parse, and the value quoted as the grammar takes it. ``resume`` takes one checkpoint,
which the line says, also for ``resume=a.ckpt,b.ckpt`` (a sweep's list in a single run).
"""

from __future__ import annotations

import re

#: What ``resume=`` takes (trainer/state/resume.py).
RESUME_TAKES = "resume takes one checkpoint: a .ckpt path, auto or null"
#: How Hydra's lexer says where it stopped: the override, then a caret under the character.
LEXER = "LexerNoViableAltException: "


def problem(argv: list[str]) -> str | None:
    """The one line that says why an override of ``argv`` does not parse, or None (also
    when the command line is not Hydra's to parse: Hydra's own flags then say it)."""
    from hydra._internal.utils import get_args_parser
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    try:
        args = get_args_parser().parse_args(argv)
    except (Exception, SystemExit):
        return None
    parser = OverridesParser.create()
    for i, override in enumerate(args.overrides):
        try:
            parsed = parser.parse_overrides([override])
        except OverrideParseException as exc:
            return _line(override, exc.message, args.overrides[:i])
        if not args.multirun and _is_resume_list(parsed[0]):
            return f"{override}: {RESUME_TAKES}, not a list; {_quoted(override)}"
    return None


def _is_resume_list(parsed) -> bool:
    """``resume=a.ckpt,b.ckpt`` (a sweep over checkpoints) or ``resume=[a.ckpt,b.ckpt]``."""
    return parsed.key_or_group == "resume" and (
        parsed.is_sweep_override() or isinstance(parsed.value(), list)
    )


def _line(override: str, message: str, before: list[str]) -> str:
    key = override.split("=", 1)[0] if "=" in override else None
    if key is None:  # a word on its own: often a value's second half, split by the shell
        after = f" after {before[-1]}" if before else ""
        line = f"{override!r}{after} is not an override: give key=value"
        if before and before[-1].split("=", 1)[0] == "resume":
            return f"{line}; {RESUME_TAKES} (a path with spaces in quotes: 'resume=\"a b.ckpt\"')"
        return f"{line} (a value with spaces in quotes: 'key=\"a b\"')"
    line = f"{override} does not parse: {_reason(override, message)}; {_quoted(override)}"
    return f"{line}; {RESUME_TAKES}" if key == "resume" else line


def _reason(override: str, message: str) -> str:
    """Which character Hydra's grammar stopped at, or its parser's own first words."""
    lines = message.splitlines()
    if lines and lines[0].startswith(LEXER) and len(lines) > 1:
        at = lines[1].index("^") - len(LEXER) if "^" in lines[1] else -1
        if 0 <= at < len(override):
            return f"{override[at]!r} (character {at + 1}) is not allowed in an unquoted value"
    reason = next((s for s in lines if not s.startswith(("Error parsing", "See "))), "")
    return re.sub(r" expecting .*", "", reason) or "not Hydra's key=value"


def _quoted(override: str) -> str:
    """The override with its value quoted as Hydra's grammar takes any text, as typed in a
    shell; a value with quotes of its own: how to escape them."""
    key, _, value = override.partition("=")
    if "'" in value or '"' in value:
        return "quote the value, a quote inside it escaped (\\' or \\\")"
    return f"quote the value: '{key}=\"{value}\"'"
