"""The time-to-target study's confirm stage and its decision (time_to_target.py's stages 3, 4).

The best ``autotune.confirm`` distinct configurations of the study (candidates.py, distinct.py:
one candidate per recipe, not one per nearby value) and the user's command run on the
same ``autotune.seeds`` seeds the study never saw, then on one more seed at a time, up to
``autotune.max_seeds``, for the candidates still undecided (sequential.py); a candidate is
accepted only when its per-seed differences from the command's, their spread floored at the
validation lattice's and at the pooled seed spread, pass a one-sided t test corrected for the
seeds added and, by Holm's step-down, for the candidates compared (paired.py,
sequential.py). The pick then runs once more on a held-out seed that neither chose it nor
accepted it: that run's figure is what the pick is expected to need. The pick is timed
against the command (confirm/speed.py).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from tuneup.autotune.confirm.advice import command_misses, search_no_answer
from tuneup.autotune.confirm.candidates import _best
from tuneup.autotune.confirm.candidates import _distinct as _distinct  # the tests import it here
from tuneup.autotune.confirm.step_cost import time_to_target
from tuneup.autotune.race import reached
from tuneup.autotune.study.trials import (
    SAMPLES,
    TIME,
    UNITS,
    lattice_gap,
    quantum,
    seed_figure,
)
from tuneup.autotune.trials import BASELINE
from tuneup.stats import paired, sequential

if TYPE_CHECKING:
    from tuneup.autotune.confirm.inputs import ConfirmInputs


def confirm(search: ConfirmInputs) -> None:
    """The baseline and the best configurations on the paired seeds, seeds added while
    undecided; ``search.confirmed[name]``: overrides, trials (one per paired seed run, in seed
    order), samples budget and, for the candidates, the corrected decision."""
    best = _best(search)
    if not best:
        search.notes.append("no study trial reached the target: nothing to confirm")
        return
    settings, seeds = search.settings, paired_seeds(search)
    entries = {
        name: {"overrides": overrides, "trial": number, "trials": [], "samples_budget": None}
        for name, overrides, number in [(BASELINE, (), None), *best]
    }

    def launch(name: str, index: int, worker=None):
        entry = entries[name]
        # a configuration's first seeds are run only if all of them fit (none half-confirmed)
        runs = settings.seeds if index == 0 else 1
        kept = _kept_for(search, entries, name, index)
        if search.left() - kept < search.confirm_seconds() * runs:
            what = "not confirmed" if index == 0 else f"not run on seed {seeds[index]}"
            search.notes.append(f"`{name}` (trial {entry['trial']}) {what}: the budget ran out")
            return None
        # the baseline within your own limits (its true samples to target on each seed); a
        # candidate within the baseline's most x autotune.race_margin
        samples = _confirm_samples(search, {"trials": base}) if entry["overrides"] else None
        for _ in range(2):  # a run whose process was killed runs again, once
            trial = search.race_run(
                name,
                entry["overrides"],
                seeds[index],
                samples=samples,
                limit_s=max(1.0, search.left() - kept),
                worker=worker,
            )
            if not trial.killed:
                break
            search.notes.append(f"`{name}` on seed {seeds[index]}: job {trial.job} was killed")
        if name == BASELINE:
            base.append(trial)
        return trial, samples

    base: list = []  # the baseline's runs on the paired seeds, as they end

    ran: dict[tuple[str, int], object] = {}  # (name, seed index) -> its trial, or None

    def run(name: str, index: int):
        found = ran.pop((name, index)) if (name, index) in ran else launch(name, index)
        if found is None:
            return None
        trial, entries[name]["samples_budget"] = found
        entries[name]["trials"].append(trial)
        return run_figure(search, trial, entries[name]["overrides"])

    _, decisions = sequential.run_seeds(
        run,
        [name for name, _, _ in best],
        settings.confidence,
        settings.seeds,
        settings.max_seeds,
        ahead=lambda runs: ran.update(at_once(search, runs, launch)),
    )
    search.confirmed = {name: entry for name, entry in entries.items() if entry["trials"]}
    for name, decision in decisions.items():  # every candidate that ran (the baseline first)
        search.confirmed[name]["decision"] = decision


def at_once(search: ConfirmInputs, runs: list[tuple[str, int]], launch) -> dict:
    """A round's runs, ``autotune.workers`` at a time, each with its worker's share of the
    machine: the baseline's first (the candidates' sample limit is read from them), then the
    candidates'. {} with one worker: each runs when the round reaches it."""
    from concurrent.futures import ThreadPoolExecutor

    from tuneup.optuna.workers import Slots

    if search.workers.count == 1 or len(runs) < 2:
        return {}
    slots = Slots(search.workers.count)
    bases = [r for r in runs if r[0] == BASELINE]  # the candidates' sample budget needs them
    rest = [r for r in runs if r[0] != BASELINE]

    def one(pair):
        with slots.take() as slot:
            return pair, launch(*pair, worker=search.workers.resources(slot))

    with ThreadPoolExecutor(search.workers.count, thread_name_prefix="tuneup-confirm") as pool:
        done = dict(pool.map(one, bases))
        done.update(pool.map(one, rest))
    return done


def run_figure(search: ConfirmInputs, trial, overrides) -> tuple[float, bool, float]:
    """(cost to target, reached, the validation lattice's step) of a confirmation run, at
    the seconds per step timed apart where the workers shared the cores (step_cost.py)."""
    step_s = (getattr(search, "step_cost", None) or {}).get(tuple(overrides))
    if step_s is None:
        return (*seed_figure(trial, search.settings.cost), quantum(trial, search.settings.cost))
    return time_to_target(trial, step_s), reached(trial), lattice_gap(trial, "step") * step_s


def paired_seeds(search) -> list[int]:
    """The seeds of the confirmation, in order: seed+1 ... seed+autotune.max_seeds."""
    return [search.seed + 1 + i for i in range(search.settings.max_seeds)]


def held_out_seed(search) -> int:
    """A seed neither the study nor the confirmation ran: the pick's reported figure."""
    return search.seed + 1 + search.settings.max_seeds


def held_out(search: ConfirmInputs, name: str) -> None:
    """The pick once more, on :func:`held_out_seed`: the seeds that accepted it chose it too
    (the best of several on them is biased low), so what it is expected to need is read from
    a seed that did neither. ``search.confirmed[name]["held_out"]``: the trial (or absent,
    with a note, when the budget does not allow it)."""
    entry = search.confirmed[name]
    if search.left() - search.speed_reserve() < search.confirm_seconds():
        search.notes.append(
            f"`{name}`: no run on the held-out seed {held_out_seed(search)}: "
            "the budget ran out (its expected figures are the paired seeds')"
        )
        return
    entry["held_out"] = search.race_run(
        name,
        entry["overrides"],
        held_out_seed(search),
        samples=_confirm_samples(search, search.confirmed[BASELINE]),
        limit_s=max(1.0, search.left() - search.speed_reserve()),
    )


def _reserve(search) -> float:
    """What the confirmation leaves: the speed stage's share and the held-out seed's run."""
    return search.speed_reserve() + search.confirm_seconds()


def _kept_for(search: ConfirmInputs, entries: dict, name: str, index: int) -> float:
    """What a confirmation run leaves for after it (:func:`_reserve`), except for the first
    candidate's first seeds while none has run: without them there is no answer at all,
    whereas the timing has the paired seeds' runs to fall back on (confirm/speed.py) and
    the held-out run may be left out with a note. Not where the workers share the cores
    (their runs' own times do not compare): there the timing's share is kept."""
    first = (
        name != BASELINE
        and index == 0
        and not any(e["trials"] for n, e in entries.items() if n != BASELINE)
    )
    if first and not search.workers.shared_cores:
        return 0.0
    return _reserve(search)


def _confirm_samples(search, baseline: dict) -> int:
    """A candidate's budget on the paired seeds: the baseline's most samples to target
    there x autotune.race_margin (at least the study's trial budget)."""
    base = [seed_figure(t, SAMPLES) for t in baseline["trials"]]
    base = [s for s, ok in base if ok]
    most = math.ceil(max(base) * search.settings.race_margin) if base else 0
    return max(most, search.baseline["trial_samples"])


def decide(search: ConfirmInputs) -> None:
    """The pick (paired seeds, on ``autotune.cost``), then its time to target against the
    baseline's (confirm/speed.py). With ``autotune.cost=time`` the pick is adopted only when
    that time is lower than the command's beyond the noise; with ``steps`` or ``samples`` the
    paired decision on that count decides and the time on this machine is information."""
    from tuneup.autotune.confirm.speed import Speed

    cost = search.settings.cost
    decisions = {n: e["decision"] for n, e in search.confirmed.items() if n != BASELINE}
    means = {
        n: sum(run_figure(search, t, e["overrides"])[0] for t in e["trials"]) / len(e["trials"])
        for n, e in search.confirmed.items()
    }
    chosen = paired.pick(decisions, means)
    less = "time" if cost == TIME else f"{UNITS[cost]}"
    if not decisions:  # the advice follows from what happened (confirm/advice.py)
        search.verdict = search_no_answer(search)
        return
    misses = command_misses(search, sequential.level(search.settings.confidence))
    if chosen is None:
        search.verdict = (
            f"not significant: no configuration needed less {less} to the target "
            "than your command in every paired seed beyond the noise; your "
            f"command is kept{misses}"
        )
        return
    pick = search.confirmed[chosen]
    held_out(search, chosen)
    search.speed = Speed(search, pick).run()
    found = search.speed.time_ratio()
    time = f"estimated time to target {ratio_text(found)} your command's"
    if cost == TIME and (found or {}).get("verdict") != "faster":
        search.verdict = (
            f"`{chosen}` needed less time on the paired seeds, but its {time} "
            f"({search.speed.time_verdict()}): not lower beyond the noise, so "
            f"your command is kept{misses}"
        )
        return
    search.recipe = pick["overrides"]
    if cost == TIME:
        search.verdict = f"`{chosen}` reaches the target sooner: {time}, faster beyond the noise"
        return
    search.verdict = (
        f"`{chosen}` needs fewer {UNITS[cost]} to the target in every paired seed "
        f"beyond the noise (autotune.cost={cost}); on this machine, {time}: "
        f"{search.speed.time_verdict()}"
    )


def ratio_text(found: dict | None) -> str:
    """A time ratio as ``0.64x [0.51, 0.8]`` (``not measured`` without rounds)."""
    if not found:
        return "not measured"
    if found.get("low") is None:
        return f"{found['estimate']:.3g}x"
    return f"{found['estimate']:.3g}x [{found['low']:.3g}, {found['high']:.3g}]"
