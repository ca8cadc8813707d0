"""Which choices of the study's space run here, and with what (space.py: build_space).

Each choice ``G=c`` of a config group in the space is composed and checked as its job would be
(space.Checks: the core's and every plugin's ``check``), first with your other values. Then
with each choice of every group ``H`` after it in the space, since a plugin's check may refuse
a pair that each half passes alone (``optimizer=schedulefree`` refuses ``scheduler=cosine``
and ``wsd``):

- ``G=c`` refused with your values, but run by one choice ``H=d``: kept, with ``H=d``;
- ``G=c`` refused with some of ``H``'s choices: kept, with your ``H`` if it runs, else the
  first that does; ``H`` is then not sampled where ``G`` is ``c`` (StudySpace.implied);
- refused with every choice of a group: left out, with the check's reason.

The groups before ``G`` are not asked: a choice depends on the ones sampled before it, as a
conditional key on its choice. Only choices other than yours are paired (your own value of a
group is what each single check already has), and each pair is composed once (the checks
keep what they composed), a fraction of a second each.
"""

from __future__ import annotations

from tuneup.autotune.study.trials import config_value
from tuneup.optuna.space import override_value


def check_choices(space, checks, groups: list[str], yours) -> dict[str, list]:
    """The choices of each of ``groups`` that run (by group); the others recorded in
    ``space.dropped`` with the reason, the companions a choice runs with in ``space.implied``.
    ``yours``: your composed config."""
    mine = {g: _name(config_value(yours, g)) if yours is not None else None for g in groups}
    kept: dict[str, list] = {}
    for index, group in enumerate(groups):
        kept[group] = []
        for choice in space.distributions[group].choices:
            override = f"{group}={override_value(choice)}"
            later = groups[index + 1 :] if _name(choice) != mine[group] else []
            runs_with, why = companions(checks, space, override, later, mine)
            if why is not None:
                space.dropped.append((override, why))
                continue
            kept[group].append(choice)
            if runs_with:
                space.implied[override] = runs_with
    return kept


def companions(checks, space, override: str, later: list[str], mine: dict):
    """({H: d} the choice runs with, None) or ({}, why it runs with none)."""
    base = [override]
    alone = _inspect(checks, base)
    runs_with: dict[str, str] = {}
    if not alone.ok:
        found = _companion(checks, space, base, later, mine)
        if found is None:
            return {}, _reason(alone.problems)
        runs_with[found[0]] = found[1]
        base.append(f"{found[0]}={found[1]}")
    for other in later:
        if other in runs_with:
            continue
        choices = [override_value(d) for d in space.distributions[other].choices]
        runs = [d for d in choices if _inspect(checks, _with(base, other, d, mine)).ok]
        if len(runs) == len(choices):
            continue
        if not runs:
            problems = _inspect(checks, _with(base, other, choices[0], mine)).problems
            return {}, _reason(problems)
        runs_with[other] = mine[other] if mine[other] in runs else runs[0]
        if runs_with[other] != mine[other]:
            base.append(f"{other}={runs_with[other]}")
    return runs_with, None


def _companion(checks, space, base, later, mine) -> tuple[str, str] | None:
    """The first choice of a later group (not yours) with which ``base`` runs."""
    for other in later:
        for choice in space.distributions[other].choices:
            value = override_value(choice)
            if value != mine[other] and _inspect(checks, [*base, f"{other}={value}"]).ok:
                return other, value
    return None


def _with(base: list[str], group: str, value: str, mine: dict) -> list[str]:
    """``base`` with ``group=value`` (nothing added for your own value: base has it)."""
    return base if value == mine[group] else [*base, f"{group}={value}"]


def _inspect(checks, overrides: list[str]):
    """One composition per set of overrides, whatever their order."""
    return checks.inspect(tuple(sorted(overrides)))


def _reason(problems) -> str:
    why = "; ".join(problems)
    if why.startswith("does not compose"):
        why = f"not in this install's config ({why})"
    return why


def _name(value) -> str | None:
    return None if value is None else override_value(value)
