"""The time-to-target confirmation's decisions on lattice data (issue 50): values to target are
read at validations, so they are multiples of a quantum (``target.check_every_n_steps`` x the
batch) and equal on a few seeds as often as not. A gain is accepted only beyond the lattice and
the seeds' pooled spread; seeds are added one at a time while undecided; the decisions are
corrected for the looks and, by Holm's step-down, for the candidates; simulated under the null
and under a true gain, pure Python (the same functions the study runs)."""

from __future__ import annotations

import math
import random

import pytest

from tuneup.stats.paired import (
    BETTER,
    MISSED,
    NOISE,
    WORSE,
    paired_gain,
    pooled_spread,
    prediction_interval,
)
from tuneup.stats.sequential import (
    BASELINE,
    _best_t,
    can_still_win,
    holm,
    is_open,
    run_seeds,
)

CONFIDENCE = 0.95
#: samples read every 5 steps at batch 32
QUANTUM = 5 * 32


def test_equal_differences_on_the_lattice_are_not_accepted():
    # three seeds, each one validation (160 samples) ahead: an interval of no width without
    # the floor; with the lattice's spread it straddles 0
    base, candidate = [(1600, True)] * 3, [(1440, True)] * 3
    assert paired_gain(base, candidate, CONFIDENCE)["verdict"] == BETTER  # no floor
    found = paired_gain(base, candidate, CONFIDENCE, quantum=(QUANTUM, QUANTUM))
    assert found["verdict"] == NOISE and found["p"] > (1 - CONFIDENCE) / 2
    assert found["interval"]["low"] < -QUANTUM < 0 < found["interval"]["high"]
    # the seeds' pooled spread floors it too: a gain of 1.5 quanta on every seed is within a
    # spread of 400 samples (pooled over configurations, 8 degrees of freedom)
    wide = paired_gain([(1600, True)] * 3, [(1360, True)] * 3, CONFIDENCE, spread=(400.0, 8))
    assert wide["verdict"] == NOISE and wide["floor_sd"] == 400.0
    # a gain far beyond both is accepted, and a loss is worse
    clear = paired_gain(
        [(4800, True), (5440, True), (4480, True)],
        [(1440, True), (1760, True), (1600, True)],
        CONFIDENCE,
        quantum=(QUANTUM, QUANTUM),
        spread=(400.0, 8),
    )
    assert clear["verdict"] == BETTER
    assert paired_gain(candidate, base, CONFIDENCE, spread=(20.0, 8))["verdict"] == WORSE


def test_holm_steps_down_across_the_candidates():
    def decision(p):
        return {"verdict": BETTER, "p_looks": [(3, p)], "p": p, "differences": [-1, -2, -3]}

    # at level 0.025: 0.004 x 3 = 0.012 passes; 0.02 x 2 = 0.04 fails, and so does every later one
    found = holm(
        {"a": decision(0.02), "b": decision(0.004), "c": decision(0.021)}, CONFIDENCE, 3, 3
    )
    assert [found[n]["verdict"] for n in "abc"] == [NOISE, BETTER, NOISE]
    assert found["a"]["corrected"] == BETTER and found["b"]["p_adjusted"] == pytest.approx(0.012)
    assert found["c"]["p_adjusted"] == pytest.approx(0.04)  # 0.021 x 1, not below an earlier
    # each alone would have passed
    assert all(
        holm({n: decision(p)}, CONFIDENCE, 3, 3)[n]["verdict"] == BETTER
        for n, p in (("a", 0.02), ("c", 0.021))
    )
    # looks: at 3 seeds of up to 8 the look gets a sixth... of a quarter of the level
    assert holm({"a": decision(0.004)}, CONFIDENCE, 3, 8)["a"]["verdict"] == NOISE
    missed = {**decision(0.001), "verdict": MISSED}
    assert holm({"a": missed}, CONFIDENCE, 3, 3)["a"]["verdict"] == MISSED


def test_the_best_t_of_the_seeds_left_is_exact():
    """can_still_win's closed form against a scan of the common value of the seeds added."""
    rng = random.Random(0)
    deltas = [0.0, *(sign * 10 ** (k / 40) for k in range(-120, 161) for sign in (1, -1))]
    for _ in range(60):
        j, n = rng.randint(1, 5), rng.randint(6, 9)
        gains = [rng.gauss(0.5, 1) for _ in range(j)]
        floor = rng.choice([0.0, 0.5, 2.0])
        a = sum(gains) / j
        w = sum((g - a) ** 2 for g in gains)
        if w == 0 and floor == 0:
            continue
        best = _best_t(a, w, floor, j, n)
        scanned = max(_t([*gains, *[a + d] * (n - j)], floor) for d in deltas)
        assert scanned <= best + 1e-9  # never says "cannot win" of one that can
        assert best - scanned < 0.02 * abs(best) + 1e-3  # and no looser (the scan's grid)


def _t(values, floor):
    n = len(values)
    mean = sum(values) / n
    sd = max(math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)), floor)
    return mean / (sd / math.sqrt(n))


def test_seeds_are_added_only_while_a_candidate_is_undecided():
    per_seed = {  # samples to target on paired seeds 1-8 (lattice of 160)
        BASELINE: [3200, 3520, 2880, 3360, 3040, 3200, 3520, 3040],
        "clear": [1600, 1760, 1440, 1600, 1600, 1760, 1440, 1600],  # half: decided at once
        "close": [2880, 3360, 2880, 3040, 2720, 2880, 3200, 2720],  # ~ 8 % fewer: more seeds
        "hopeless": [3520, 3680, 3200, 3520, 3360, 3680, 3840, 3360],  # more: cannot win
        "miss": [1600, 9999, 1440, 1600, 1600, 1760, 1440, 1600],  # missed seed 2
    }
    ran = []

    def run(name, i):
        ran.append((name, i))
        value = per_seed[name][i]
        return (value, value != 9999, QUANTUM)

    figures, decisions = run_seeds(run, ["clear", "close", "hopeless", "miss"], CONFIDENCE, 3, 8)
    seeds = {name: len(values) for name, values in figures.items()}
    assert seeds["clear"] == seeds["miss"] == 3  # decided on the first seeds
    assert decisions["clear"]["verdict"] == BETTER and decisions["miss"]["verdict"] == MISSED
    assert 3 < seeds["hopeless"] < 8 and decisions["hopeless"]["verdict"] == WORSE
    assert seeds["close"] == 8 == seeds[BASELINE] and decisions["close"]["verdict"] == BETTER
    assert [i for name, i in ran if name == BASELINE] == list(range(8))
    assert not is_open(decisions["clear"], CONFIDENCE, 3, 8, 4)
    # no seeds left that could make it win: a candidate behind on 7 seeds of 8
    behind = paired_gain([(3200, True)] * 7, [(3360, True)] * 7, CONFIDENCE, quantum=(160, 160))
    assert not can_still_win(behind, CONFIDENCE, 3, 8)
    assert can_still_win({**behind, "differences": behind["differences"][:3]}, CONFIDENCE, 3, 8)
    # the budget: a run that does not fit ends the confirmation, with what ran decided
    figures, decisions = run_seeds(
        lambda name, i: None if name == "close" else run(name, i),
        ["clear", "close"],
        CONFIDENCE,
        3,
        8,
    )
    assert figures["close"] == [] and set(decisions) == {"clear"}


def simulate(draws: int, gains: list[float], rho: float, sigma: float = 0.15, seed: int = 0):
    """``draws`` confirmations (3 seeds, up to 8) of candidates needing ``1 - gain`` of the
    baseline's samples (median 2,400); seed noise log-normal (``sigma``), a share ``rho`` of its
    variance common to the configurations on one seed, rounded up to the lattice. Gives each
    candidate's share of draws accepted, the share with any true-null candidate accepted,
    and the runs per draw."""
    rng = random.Random(seed)
    names = [f"c{i}" for i in range(len(gains))]
    factor = dict(zip([BASELINE, *names], [1.0, *[1 - g for g in gains]], strict=True))
    accepted, family, runs = [0] * len(gains), 0, 0
    for _ in range(draws):
        shared = [rng.gauss(0, sigma * math.sqrt(rho)) for _ in range(8)]
        own = {n: [rng.gauss(0, sigma * math.sqrt(1 - rho)) for _ in range(8)] for n in factor}

        def run(name, i, shared=shared, own=own):
            true = 2400 * factor[name] * math.exp(shared[i] + own[name][i])
            return (math.ceil(true / QUANTUM) * QUANTUM, True, QUANTUM)

        figures, decisions = run_seeds(run, names, CONFIDENCE, 3, 8)
        runs += sum(map(len, figures.values()))
        hits = [decisions[n]["verdict"] == BETTER for n in names]
        accepted = [a + h for a, h in zip(accepted, hits, strict=True)]
        family += any(h for h, g in zip(hits, gains, strict=True) if g == 0)
    return [a / draws for a in accepted], family / draws, runs / draws


def test_false_accepts_under_the_null_stay_within_the_level():
    # three candidates no better than the baseline, seeds independent between configurations
    # (the pairing removes nothing: the floor's worst case); without the corrections for the
    # looks and the candidates 16 % of these draws accepted one
    _, family, runs = simulate(2000, [0.0, 0.0, 0.0], rho=0.0)
    assert family <= 1 - CONFIDENCE
    assert runs < 4 * 8  # seeds stop being added once a candidate cannot win


def test_the_power_to_accept_a_true_20_percent_gain():
    # one candidate needs 20 % fewer samples, two are no better; seed noise 15 % (log-normal),
    # half of it common to the configurations on a seed: docs/autotune.md states this power
    (power, *_), family, _ = simulate(2000, [0.2, 0.0, 0.0], rho=0.5)
    assert power >= 0.65
    assert family <= 1 - CONFIDENCE


def test_the_next_seed_interval_is_pooled_on_the_log_scale_and_floored_by_the_lattice():
    # one value on every seed: its own spread would promise it again; the lattice says a new
    # seed may land a validation either side
    alone = prediction_interval([960] * 3, CONFIDENCE, quantum=QUANTUM)
    assert alone["low"] < 960 - QUANTUM / 2 and alone["high"] > 960 + QUANTUM / 2
    # multiplicative: the same spread of logs widens a larger value's interval in proportion
    spread = pooled_spread([[1600, 1920, 1600], [960] * 3, [960, 960, 1280]], log=True)
    assert spread[1] == 6
    small = prediction_interval([960] * 3, CONFIDENCE, spread=spread)
    large = prediction_interval([9600] * 3, CONFIDENCE, spread=spread)
    assert large["low"] == pytest.approx(10 * small["low"])
    assert large["high"] == pytest.approx(10 * small["high"])
    assert small["high"] / small["estimate"] == pytest.approx(small["estimate"] / small["low"])
    assert 0 < small["low"] < 960 < small["high"]
    assert pooled_spread([[960], [5]], log=True) is None


def test_a_trials_lattice_is_the_gap_between_its_validations():
    from pathlib import Path

    from tuneup.autotune.study.trials import quantum
    from tuneup.autotune.trials import Trial

    def trial(samples):
        history = [{"step": s // 32, "samples": s} for s in samples]
        return Trial("x", (), "0", Path("."), {"status": "ok", "target_history": history}, 1.0)

    assert quantum(trial([160, 320, 480, 640])) == QUANTUM  # every 5 steps at batch 32
    assert quantum(trial([160])) == QUANTUM  # reached at the first validation
    assert quantum(trial([])) == 0.0
