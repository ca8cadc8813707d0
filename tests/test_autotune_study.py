"""experiment=autotune autotune.objective=time_to_target (issue 42): an Optuna study over what
decides races (the learning rate first), trials pruned by samples seen, a study that a SIGKILL
does not lose, paired seeds that refuse a gain within the noise, one-line errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import pytorch_lightning as pl

import tuneup
from tests.conftest import ROOT, compose_config, python, run_cli
from tuneup.autotune.settings import Settings
from tuneup.stats.paired import (
    BETTER,
    MISSED,
    NOISE,
    WORSE,
    mean_interval,
    paired_gain,
    pick,
    pooled_spread,
    prediction_interval,
)

optuna = pytest.importorskip("optuna")

# -- the decision on paired seeds -------------------------------------------------------------


def test_a_gain_within_the_noise_of_paired_seeds_is_not_accepted():
    base = [(4000, True), (4400, True), (3600, True)]
    # a 4% lower mean whose per-seed differences straddle 0: not significant
    straddles = paired_gain(base, [(3200, True), (4800, True), (3500, True)], 0.95)
    assert straddles["verdict"] == NOISE
    assert straddles["interval"]["low"] < 0 < straddles["interval"]["high"]
    # lower in every seed by about the same: better, and its interval excludes 0
    better = paired_gain(base, [(2600, True), (2880, True), (2400, True)], 0.95)
    assert better["verdict"] == BETTER and better["interval"]["high"] < 0
    assert paired_gain(base, [(4600, True), (5000, True), (4300, True)], 0.95)["verdict"] == WORSE
    # a candidate that misses the target in a seed is never accepted, however fast elsewhere
    missed = paired_gain(base, [(800, True), (6000, False), (900, True)], 0.95)
    assert missed["verdict"] == MISSED and missed["missed_seeds"] == [1]
    # a baseline that missed counts at the samples it ran: never "worse" on a lower bound
    censored = paired_gain([(3000, False)] * 3, [(3100, True), (3300, True), (3200, True)], 0.95)
    assert censored["verdict"] == NOISE
    # where a re-run on a new seed should land: wider than the mean's interval
    mean, new = (
        mean_interval([2240, 2240, 2560], 0.95),
        prediction_interval([2240, 2240, 2560], 0.95),
    )
    assert new["low"] < mean["low"] and mean["high"] < new["high"]
    # pooled over configurations: wider than a configuration's own spread of 0
    spread = pooled_spread([[1600, 1920, 1600], [960] * 3, [960, 960, 1280], [5]], log=True)
    assert spread[1] == 6
    assert prediction_interval([960] * 3, 0.95)["high"] == pytest.approx(960)
    pooled = prediction_interval([960] * 3, 0.95, spread=spread)
    assert pooled["low"] < 960 < pooled["high"]
    decisions = {"a": straddles, "b": better, "c": missed}
    assert pick(decisions, {"a": 3833, "b": 2627, "c": 2567}) == "b"
    assert pick({"a": straddles}, {"a": 1.0}) is None


def test_the_advice_without_an_answer_follows_from_what_happened():
    """More budget only where the budget stopped something: a target the command never reaches
    within its own limits asks for more training or an easier target instead."""
    from tuneup.autotune.confirm.advice import OUT_OF_TIME, OWN_LIMITS, baseline_stop, no_answer

    loss = {"metric": "val/loss", "value": 0.001, "mode": "auto"}
    missed = {"reached": False, "samples_seen": 4224, "best": 0.4123, "mode": "min"}
    own = no_answer(loss, {**missed, "stopped": OWN_LIMITS}, 12, 30, 0, 1.5, best=0.3981)
    assert own.startswith(
        "your command never reached val/loss <= 0.001 within its own limits "
        "(4,224 samples; best val/loss seen 0.3981 (your command's: 0.4123))"
    )
    assert "nor did any of the study's 12 trial(s)" in own
    assert "trainer.max_epochs" in own and "easier target.value" in own
    assert "raise autotune.budget" not in own
    none = no_answer(loss, {**missed, "stopped": OWN_LIMITS}, 0, 30, 0, 1.5)
    assert "seen 0.4123), and the study ran no trial: your command is kept; train longer" in none
    late = no_answer(loss, {**missed, "stopped": OUT_OF_TIME}, 0, 30, 0, 1.5)
    assert "before the autotune's time ran out" in late and "raise autotune.budget_minutes" in late
    reached = {"reached": True, "samples_seen": 960, "best": 0.95, "mode": "max"}
    acc = {"metric": "val/acc", "value": 0.9, "mode": "auto"}
    cut = no_answer(acc, reached, 4, 30, 0, 1.5)
    assert cut.startswith(
        "the budget stopped the study after 4 of autotune.budget_trials=30 "
        "trials, none of which reached val/acc >= 0.9: your command is kept"
    )
    assert "raise autotune.budget_minutes" in cut
    every = no_answer(acc, reached, 30, 30, 0, 1.5)
    assert every.startswith("none of the study's 30 trials reached val/acc >= 0.9 within its")
    assert "raise" not in every and "autotune.race_margin=1.5" in every
    unconfirmed = no_answer(acc, reached, 30, 30, 2, 1.5)
    assert "budget ran out before they were confirmed" in unconfirmed
    # the baseline's own figures: why it stopped, from the time the autotune gave it
    summary = {"target": {"reached": False, "best": 0.41, "mode": "min"}}
    assert baseline_stop(summary, 60.0, 25.0) == {
        "best": 0.41,
        "mode": "min",
        "stopped": OWN_LIMITS,
    }
    assert baseline_stop(summary, 60.0, 61.5)["stopped"] == OUT_OF_TIME
    assert baseline_stop({"target": {"reached": True}}, 60.0, 61.5)["stopped"] is None


# -- bad values: one line, before any trial ---------------------------------------------------


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"budget_trials": 0}, "autotune.budget_trials=0 is not allowed: expected an integer >= 1"),
        ({"objective": "time_to_targt"}, "autotune.objective='time_to_targt' is not allowed: "
         "expected throughput | time_to_target"),
        ({"params": {"optimizer.lr": "tag(log, interval(1e-3"}},
         "autotune.params.optimizer.lr='tag(log, interval(1e-3' is not allowed"),
        ({"pruner": "median"}, "autotune.pruner='median' is not allowed: expected "
         "successive_halving | hyperband | none"),
        ({"method": "greedy"}, "autotune.method is not an autotune setting"),  # removed
        ({"seeds": 3, "max_seeds": 2}, "autotune.max_seeds=2 is not allowed: expected an "
         "integer >= autotune.seeds (3)"),
        ({"cost": "wallclock"}, "autotune.cost='wallclock' is not allowed: expected time | "
         "steps | samples"),
        ({"sampler": "grid"}, "autotune.sampler='grid' is not allowed: expected tpe | random"),
        ({"sampler_seed": -1}, "autotune.sampler_seed=-1 is not allowed: expected null or an "
         "integer >= 0"),
    ],
)  # fmt: skip
def test_bad_study_settings_are_one_line_errors(values, message):
    from omegaconf import OmegaConf

    with pytest.raises(tuneup.TuneupError) as caught:
        Settings.from_config(OmegaConf.create({"autotune": values}))
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_the_sampler_is_tpe_or_random_seeded_by_sampler_seed_or_the_runs_seed():
    """autotune.sampler=random: the race's control search (bench/race.py); sampler_seed: three
    independent searches from one command."""
    from tuneup.autotune.time_to_target import study_sampler

    def first_draws(sampler):
        study = optuna.create_study(sampler=sampler)
        return [study.ask().suggest_float("lr", 1e-4, 1.0, log=True) for _ in range(3)]

    assert isinstance(study_sampler(Settings(), 0), optuna.samplers.TPESampler)
    random = study_sampler(Settings(sampler="random"), 5)
    assert isinstance(random, optuna.samplers.RandomSampler)
    assert first_draws(random) == first_draws(optuna.samplers.RandomSampler(seed=5))
    own = study_sampler(Settings(sampler="random", sampler_seed=7), 5)  # the run's seed is 5
    assert first_draws(own) == first_draws(optuna.samplers.RandomSampler(seed=7))
    assert first_draws(study_sampler(Settings(sampler_seed=7), 5)) == first_draws(
        study_sampler(Settings(), 7)
    )


def test_a_bad_value_on_the_command_line_stops_before_any_trial(tmp_path):
    done = run_cli(
        "-m",
        "experiment=autotune",
        "autotune.objective=time_to_target",
        "autotune.budget_trials=0",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        cwd=tmp_path,
        tiny=False,
    )
    assert done.returncode == 1
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        "error: autotune settings: autotune.budget_trials=0 is not allowed: expected an "
        "integer >= 1"
    ]
    assert not (tmp_path / "sweep" / "0").exists()


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (["target.metric=val/f1"], "error: your command: [target] target.metric=val/f1 is not "
         "logged by this run: task=classification logs val/loss, val/acc at each validation"),
        (["target.metric=val/acc", "optimizer.lr=tag(log, interval(0.3, 1e-4))"],
         "error: optimizer.lr=tag(log, interval(0.3, 1e-4)): the interval is empty: its low end "
         "0.3 is above its high end 0.0001; give the low end first: "
         "tag(log, interval(0.0001, 0.3))"),
    ],
    ids=["unlogged-metric", "reversed-interval"],
)  # fmt: skip
def test_what_the_baseline_would_refuse_is_one_line_before_anything_is_written(
    tmp_path, bad, message
):
    """The user's command is checked in the sweeper's process as a single run checks it, and
    its sweeps parsed: no baseline job, no journal, no sweep folder's files, printed once."""
    sweep_dir = tmp_path / "sweep"
    done = run_cli(
        "-m",
        "experiment=autotune",
        "autotune.objective=time_to_target",
        *TASK[:6],
        *bad,
        "target.value=0.9",
        f"hydra.sweep.dir={sweep_dir}",
        cwd=tmp_path,
        tiny=False,
    )
    assert done.returncode == 1, done.stderr[-2000:]
    assert done.stderr.strip().splitlines() == [message]
    assert "Traceback" not in done.stdout + done.stderr
    assert not sweep_dir.exists() or not any(sweep_dir.iterdir())  # no job, journal, yaml


def test_a_storage_the_autotune_cannot_write_is_named_as_the_user_gave_it(tmp_path):
    """autotune.storage, not the Optuna sweeper's hydra.sweeper.storage it shares code with."""
    from tuneup.autotune.time_to_target import StudySearch

    (tmp_path / "a_file").write_text("")
    storage = str(tmp_path / "a_file" / "optuna.journal")  # under a file: unwritable, even as root
    search = StudySearch(Settings(), lab=None, checks=None, budget=None, seed=0, storage=storage)
    with pytest.raises(tuneup.TuneupError) as caught:
        search.open_study()
    assert str(caught.value).startswith(f"autotune.storage={storage}: cannot open or write")
    assert "hydra.sweeper" not in str(caught.value)


# -- pruning: rungs at S/3 and S samples, trials compared at the rung's samples -------------


def study_pruner(baseline: dict, pruner: str = "successive_halving"):
    """The pruner node a trial's job gets (hydra.sweeper.pruner), as Hydra parses it."""
    from types import SimpleNamespace

    from hydra.core.override_parser.overrides_parser import OverridesParser

    from tuneup.autotune.time_to_target import StudySearch

    settings = SimpleNamespace(seeds=1, pruner=pruner, confirm=1, min_rounds=2)
    search = StudySearch(settings, None, None, None, 0, "")
    search.baseline = baseline
    [override] = OverridesParser.create().parse_overrides([f"p={search.pruner_spec()}"])
    return override.value()


def test_rungs_are_at_a_third_of_the_baselines_samples_and_at_them():
    """S: the baseline's samples to target, or the samples it ran when it missed the target
    (docs/autotune.md); a missed baseline put the first rung at S/9 (711 of 6,400), and trials
    were pruned at 720, 800, 960 and 1,280 samples."""
    from tuneup.plugins.optuna_trial import rung_schedule

    missed = {"samples_to_target": None, "samples_seen": 6400, "trial_samples": 6400}
    assert study_pruner(missed)["min_resource"] == 2133
    assert rung_schedule(study_pruner(missed)) == (2133, 3)
    reached = {"samples_to_target": 4160, "samples_seen": 4160, "trial_samples": 6240}
    assert rung_schedule(study_pruner(reached)) == (1386, 3)  # rungs 1,386 and 4,158
    assert rung_schedule(study_pruner(reached, "hyperband")) == (1386, 3)
    assert rung_schedule("none") is None and rung_schedule("median") is None


def test_trials_are_judged_at_the_rungs_samples_not_at_their_next_validation():
    """A trial validating every 1,280 samples (batch 256) and one validating every 160 (batch
    32), at the rung of 2,133 samples: each reports its distance to the target there, linear
    between its validations around it, at step 2,133. Judged at their first validation past
    it instead (2,560 and 2,240 samples), the first would have had 427 samples more and
    pruned the second, which is ahead at equal samples."""
    from tuneup.optuna.study import make_pruner
    from tuneup.plugins.optuna_trial import Plugin, pruned_line, values_at_rungs

    assert values_at_rungs([(1280, 0.30), (2560, 0.02)], 2133, 3, 0) == [
        (2133, pytest.approx(0.30 - 0.28 * 853 / 1280))
    ]
    assert values_at_rungs([(1280, 0.3)], 2133, 3, 0) == []  # not there yet
    assert values_at_rungs([(2560, 0.2)], 2133, 3, 0) == [(2133, 0.2)]  # no validation before
    both = values_at_rungs([(1280, 0.3), (6400, 0.1)], 2133, 3, 0)  # 2,133 and 6,399
    assert [rung for rung, _ in both] == [2133, 6399]
    assert values_at_rungs([(1280, 0.3), (6400, 0.1)], 2133, 3, 1) == both[1:]

    spec = {
        "_target_": "optuna.pruners.SuccessiveHalvingPruner",
        "min_resource": 2133,
        "reduction_factor": 3,
        "min_early_stopping_rate": 0,
    }
    study = optuna.create_study(pruner=make_pruner(spec))
    stops = []
    for validations in (
        [(1280, 0.30), (2560, 0.02)],
        [(160 * k, 0.10 - 0.01 * (k - 13)) for k in range(1, 15)],
    ):
        trial = Plugin(None)  # outside a sweep: given a study's trial as a job would be
        trial.settings, trial.by_samples, trial.rungs = {"trial": 0}, True, (2133, 3)
        trial.trial = study.ask()
        for trial.samples, value in validations:
            stops.append(trial._ask(value, trial.samples // 32)[0])
        study.tell(trial.trial, 0.0)
    assert not any(stops)  # both promoted past the rung
    assert [t.intermediate_values for t in study.trials] == [
        {2133: pytest.approx(0.30 - 0.28 * 853 / 1280)},  # 0.113
        {2133: pytest.approx(0.10 - 0.01 * 53 / 160)},  # 0.097: ahead at equal samples
    ]
    assert pruned_line(3, 4, 45, 720, 2133) == (
        "optuna: trial 3 (job #4) pruned after 45 optimizer steps (720 samples), behind at "
        "the rung of 2,133 samples"
    )


# -- the default space ------------------------------------------------------------------------


def test_the_default_space_holds_the_hand_recipes_and_drops_what_is_not_installed():
    from optuna.distributions import CategoricalDistribution

    from tuneup.autotune.space import Checks
    from tuneup.autotune.study.space import build_space, default_params
    from tuneup.optuna.space import parse_space

    def compose(overrides):
        return compose_config(["trainer.accelerator=cpu", *overrides])

    for optimizer, hand in (("sgd", 0.2), ("adamw", 0.003)):  # bench/race.py's hand recipes
        params = default_params(compose([f"optimizer={optimizer}"]), 40)
        key = f"optimizer.lr@{optimizer}"  # your optimizer's own range (study/family.py)
        lr = parse_space({key: params[key]}, []).distributions[key]
        assert lr.log and lr.low < hand < lr.high
    space = build_space(params, [], Checks(compose), lambda key: key == "scheduler")
    assert space.distributions["scheduler.warmup_steps"].high == 40
    assert space.parent("ema.decay") == "ema" and space.parent("data.batch_size") is None
    assert isinstance(space.distributions["scheduler"], CategoricalDistribution)
    installed = (ROOT / "conf" / "scheduler" / "wsd.yaml").is_file()
    assert ("wsd" in space.distributions["scheduler"].choices) == installed
    dropped = dict(space.dropped)
    assert installed or dropped["scheduler=wsd"].startswith("not in this install's config")


# -- the user's schedule: a race budget the scheduler does not see ----------------------------

#: The user's command: 16 steps of a cosine schedule; a trial's budget stops it after 4.
SCHEDULED = [
    "data.train_samples=256",
    "data.val_samples=32",
    "data.batch_size=32",
    "model=mlp",
    "model.hidden=[8]",
    "trainer.max_steps=16",
    "trainer.max_epochs=-1",
    "scheduler=cosine",
    "target.metric=val/loss",
    "target.value=1e-9",
    "target.check_every_n_steps=4",
    "trainer.enable_progress_bar=false",
    "measure.console_table=false",
]


class LearningRates(pl.Callback):
    """Writes the learning rate of every optimizer step of the run to ``path`` (a Lightning
    callback; Hydra imports this module anew, so it reports through a file)."""

    def __init__(self, path: str) -> None:
        self.path, self.seen = Path(path), []

    def on_train_batch_end(self, trainer, *args):
        self.seen.append(trainer.optimizers[0].param_groups[0]["lr"])
        self.path.write_text(json.dumps(self.seen))


def test_a_study_trial_keeps_the_schedule_the_recipe_runs(tmp_path):
    from tuneup.autotune.race import race_settings, sample_limit, speed_settings

    def learning_rates(run: str, overrides: list[str]) -> list[float]:
        log = tmp_path / f"{run}.json"
        callback = f"+callbacks.lr={{_target_: {__name__}.LearningRates, path: '{log}'}}"
        tuneup.run(
            compose_config([*SCHEDULED, *overrides, callback], tiny=False), run_dir=tmp_path / run
        )
        return json.loads(log.read_text())

    candidate = ["data.batch_size=16"]  # the candidate's own batch size: 16 steps of 16
    recipe = learning_rates("recipe", candidate)
    budget = [*race_settings(60), *sample_limit(4 * 16)]  # what race_run adds
    seen = learning_rates("trial", [*budget, *candidate])
    trial = json.loads((tmp_path / "trial" / "summary.json").read_text())
    assert len(recipe) == 16 and trial["steps"] == 4 == len(seen)
    assert seen == pytest.approx(recipe[:4])  # not a cosine squeezed into 4 steps
    assert seen[3] > 0.8 * seen[0]  # squeezed, the 4th step would end the decay at 0
    speed = speed_settings(4, 16)
    assert "target.max_samples=64" in speed and not [s for s in speed if "max_steps" in s]


# -- one real study: killed with SIGKILL, continued by the same command -----------------------

#: Digits, a small MLP, a learning rate 10x below sgd's default (it misses the target within
#: its 3 epochs on the paired seeds: a miss counts at the samples it ran); the study searches the learning rate.
TASK = [
    "data=digits",
    "model=mlp",
    "model.hidden=[32]",
    "data.image_size=8",
    "data.channels=1",
    "trainer.max_epochs=3",
    "target.metric=val/acc",
    "target.value=0.8",
    "target.check_every_n_steps=5",
    "optimizer.lr=0.005",
    "trainer.enable_progress_bar=false",
]
TRIALS = 4


def study_command(sweep_dir: Path) -> list[str]:
    return [
        str(ROOT / "run.py"),
        "-m",
        "experiment=autotune",
        "autotune.objective=time_to_target",
        "autotune.stages=[study]",  # the study alone (the pipeline: test_autotune_stages.py)
        f"autotune.budget_trials={TRIALS}",
        "autotune.seeds=2",
        "autotune.max_seeds=2",
        "autotune.confirm=1",
        "autotune.trial_steps=4",
        "autotune.max_rounds=2",
        "autotune.cost=steps",
        "autotune.params={optimizer.lr: 'tag(log, interval(2e-3, 0.3))'}",
        f"hydra.sweep.dir={sweep_dir}",
        *TASK,
    ]


def finished_trials(journal: Path) -> list:
    if not journal.is_file():
        return []
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    storage = JournalStorage(JournalFileBackend(str(journal)))
    try:
        study = optuna.load_study(study_name="autotune", storage=storage)
    except KeyError:  # not created yet
        return []
    states = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
    return [t for t in study.get_trials(states=states) if not t.user_attrs.get("tuneup_baseline")]


@pytest.fixture(scope="module")
def continued(tmp_path_factory):
    """The study killed (SIGKILL) once its first trial finished, then run again as it was."""
    folder = tmp_path_factory.mktemp("study")
    sweep_dir = folder / "sweep"
    journal = sweep_dir / "optuna.journal"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    first = subprocess.Popen(
        [*python(), *study_command(sweep_dir)],
        cwd=folder,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 240
    while not finished_trials(journal) and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
    before = {t.number: t.user_attrs["tuneup_job"] for t in finished_trials(journal)}
    first.send_signal(signal.SIGKILL)
    first.wait()
    # a warm start (tests/warm.py): the zygote ends the study's process once its client is
    # killed; until it is gone it could still write to the journal
    from tuneup.optuna.study import SWEEPER_ATTR, is_gone

    owners = {t.user_attrs.get(SWEEPER_ATTR) for t in finished_trials(journal)}
    while not all(map(is_gone, owners)) and time.monotonic() < deadline + 30:
        time.sleep(0.05)
    done = subprocess.run(
        [*python(), *study_command(sweep_dir)],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    record = json.loads((sweep_dir / "autotune.json").read_text())
    return {"dir": sweep_dir, "before": before, "record": record, "done": done}


def test_a_killed_study_continues_without_rerunning_finished_trials(continued):
    before, record = continued["before"], continued["record"]
    assert 1 <= len(before) < TRIALS  # killed after its first trial, before the last
    study = optuna.load_study(
        study_name="autotune",
        storage=optuna.storages.JournalStorage(
            optuna.storages.journal.JournalFileBackend(str(continued["dir"] / "optuna.journal"))
        ),
    )  # the user's way in: optuna.load_study on the sweep's journal
    finished = [
        t
        for t in study.trials
        if t.state.name in ("COMPLETE", "PRUNED") and not t.user_attrs.get("tuneup_baseline")
    ]
    assert len(finished) == TRIALS
    jobs = [t.user_attrs["tuneup_job"] for t in finished]
    assert len(set(jobs)) == TRIALS  # each finished trial ran once
    for number, job in before.items():  # the ones finished before the kill were not run again
        assert study.trials[number].user_attrs["tuneup_job"] == job
    launched = [t for t in record["trials"] if t["label"] not in ("baseline", "speed")]
    assert not {t["job"] for t in launched} & set(before.values())
    assert "continued study 'autotune'" in " ".join(record["notes"])


def test_the_study_finds_a_higher_learning_rate_that_needs_fewer_steps(continued):
    record = continued["record"]
    text = (continued["dir"] / "autotune.md").read_text()
    [found] = record["recipe"]["found"]
    assert found.startswith("optimizer.lr=") and float(found.split("=")[1]) > 0.005
    rows = {r["label"]: r for r in record["confirmed"]}
    base, mine = rows["baseline"], rows[found]
    assert mine["decision"]["verdict"] == "better" and mine["decision"]["interval"]["high"] < 0
    for m, b in zip(mine["samples_to_target"], base["samples_to_target"], strict=True):
        assert m is not None and (b is None or m < b)  # None: missed within your own limits
    assert mine["cost"] == [float(s) for s in mine["steps_to_target"]]  # autotune.cost=steps
    assert record["cost"]["name"] == "steps" and "`autotune.cost=steps`: optimizer steps" in text
    for row in record["confirmed"]:  # the figures are the runs' own, on the paired seeds
        for job, samples in zip(row["jobs"], row["samples_to_target"], strict=True):
            summary = json.loads((continued["dir"] / job / "summary.json").read_text())
            assert summary["samples_to_target"] == samples
    new_seed = record["recipe"]["samples_to_target_next_seed"]
    assert new_seed["low"] <= min(mine["samples_to_target"]) <= max(mine["samples_to_target"])
    assert max(mine["samples_to_target"]) <= new_seed["high"]
    # what the pick is expected to need: its run on a seed that neither chose nor accepted it
    expected = record["recipe"]["expected"]
    assert expected["seed"] == record["seeds"]["held_out"] not in record["seeds"]["confirm"]
    held = json.loads((continued["dir"] / expected["job"] / "summary.json").read_text())
    assert expected["samples_to_target"] == held["samples_to_target"] and expected["reached"]
    overrides = (continued["dir"] / expected["job"] / ".hydra" / "overrides.yaml").read_text()
    assert f"seed={expected['seed']}" in overrides and found in overrides
    assert mine["seeds"] == record["seeds"]["confirm"] == [1, 2]
    speed = record["speed"]
    assert speed["rounds"] == 2 and speed["time_verdict"]  # paired, interleaved windows
    time = speed["time_ratio"]  # one interval on the log scale, shown as information here
    assert time["seeds"] == 2 and time["rounds"] == 2 and time["df"] >= 1
    assert speed["time_verdict"].startswith(time["verdict"])  # faster (beyond the noise)...
    assert "(autotune.cost=steps); on this machine, estimated time to target" in record["verdict"]
    text = (continued["dir"] / "autotune.md").read_text()
    # the space it searched, printed: autotune.params' one key, on every trial
    assert record["space"]["searched"] == [
        {
            "key": "optimizer.lr",
            "name": "optimizer.lr",
            "distribution": "log-uniform [0.002, 0.3]",
            "condition": "every trial",
        }
    ]
    assert "## Searched space" in text
    assert "| `optimizer.lr` | log-uniform [0.002, 0.3] | every trial |" in text
    command = f"tuneup --config-dir {continued['dir'] / 'conf'} experiment=recipe target.stop=true"
    assert record["recipe"]["command"] == command and command in text
    assert "| better, p " in text and f"held-out seed {expected['seed']}" in text
    recipe = tuneup.compose(
        ["experiment=recipe", "target.stop=true"], config_dir=continued["dir"] / "conf"
    )
    assert recipe.optimizer.lr == pytest.approx(float(found.split("=")[1]))
    assert recipe.target.value == 0.8 and "autotune" not in recipe
    assert (continued["dir"] / "autotune.png").stat().st_size > 10_000


def test_trials_behind_at_equal_samples_are_pruned_with_the_samples_they_ran(continued):
    record = continued["record"]
    pruned = [t for t in record["explore"] if t["state"] == "PRUNED"]
    assert pruned, [(t["state"], t["overrides"]) for t in record["explore"]]
    for trial in pruned:
        summary = json.loads((continued["dir"] / trial["job"] / "summary.json").read_text())
        assert summary["status"] == "pruned"
        stopped = summary["pruned"]  # optimizer steps and samples apart, and the rung judged
        assert stopped["samples"] == trial["pruned_at_samples"] > 0 and stopped["step"] > 0
        assert summary["target_history"][-1]["samples"] == trial["pruned_at_samples"]
        assert summary["target_history"][-1]["step"] == stopped["step"]
        assert stopped["rung"] <= stopped["samples"]
        assert not summary["target"]["reached"]
    text = (continued["dir"] / "autotune.md").read_text()
    steps, samples = pruned[0]["steps"], pruned[0]["pruned_at_samples"]
    assert f"| pruned | - | {steps:,} | {samples:,} | {samples} |" in text
    for trial in record["explore"]:  # the user's schedule: a sample limit, not max_steps
        if trial["job"] is not None and not trial["baseline"]:
            overrides = (continued["dir"] / trial["job"] / ".hydra" / "overrides.yaml").read_text()
            assert "target.max_samples=" in overrides and "trainer.max_steps" not in overrides
            assert trial["steps"] > 0 and trial["cost"] == trial["steps"]
    console = continued["done"].stdout + continued["done"].stderr
    assert "autotune: trial " in console and "samples; autotune.cost=steps)" in console


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__]))
