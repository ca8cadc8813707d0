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

import tuneup
from tests.conftest import ROOT, compose_config, python, run_cli
from tuneup.autotune.paired import (
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
from tuneup.autotune.settings import Settings

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
    # where a re-run on a new seed should land: wider than the mean's interval (digits' pick
    # on seeds 1-3, then 3,200, 2,880, 2,560 on seeds 10-12: inside it, not inside the mean's)
    mean, new = (
        mean_interval([2240, 2240, 2560], 0.95),
        prediction_interval([2240, 2240, 2560], 0.95),
    )
    assert new["low"] < mean["low"] and mean["high"] < 2880 < 3200 < new["high"]
    # python_source's pick, 960 on each paired seed: its own spread is 0; pooled with the
    # command's (1,600, 1,920, 1,600) and another's (960, 960, 1,280) it holds 960 and 1,280,
    # two of its three re-runs on seeds 10-12 (960, 1,280, 1,600)
    assert prediction_interval([960] * 3, 0.95)["high"] == 960
    spread = pooled_spread([[1600, 1920, 1600], [960] * 3, [960, 960, 1280], [5]])
    assert spread[1] == 6 and spread[0] == pytest.approx((2 * (2 * 320**2 / 3) / 6) ** 0.5)
    pooled = prediction_interval([960] * 3, 0.95, floor=0.0, spread=spread)
    assert pooled["low"] < 960 < 1280 < pooled["high"] < 1600
    assert pooled_spread([[960], [5]]) is None
    decisions = {"a": straddles, "b": better, "c": missed}
    assert pick(decisions, {"a": 3833, "b": 2627, "c": 2567}) == "b"
    assert pick({"a": straddles}, {"a": 1.0}) is None


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
    from tuneup.autotune.study_search import study_sampler

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
    done = run_cli("-m", "experiment=autotune", "autotune.objective=time_to_target",
                   "autotune.budget_trials=0", f"hydra.sweep.dir={tmp_path / 'sweep'}",
                   cwd=tmp_path, tiny=False)  # fmt: skip
    assert done.returncode == 1
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        "error: autotune settings: autotune.budget_trials=0 is not allowed: expected an "
        "integer >= 1"
    ]
    assert not (tmp_path / "sweep" / "0").exists()


# -- the default space ------------------------------------------------------------------------


def test_the_default_space_holds_the_hand_recipes_and_drops_what_is_not_installed():
    from optuna.distributions import CategoricalDistribution

    from tuneup.autotune.space import Checks
    from tuneup.autotune.study_space import build_space, default_params
    from tuneup.optuna.space import parse_space

    def compose(overrides):
        return compose_config(["trainer.accelerator=cpu", *overrides])

    for optimizer, hand in (("sgd", 0.2), ("adamw", 0.003)):  # bench/race.py's hand recipes
        params = default_params(compose([f"optimizer={optimizer}"]), 40)
        lr = parse_space({"optimizer.lr": params["optimizer.lr"]}, []).distributions["optimizer.lr"]
        assert lr.log and lr.low < hand < lr.high
    space = build_space(params, [], Checks(compose), lambda key: key == "scheduler")
    assert space.distributions["scheduler.warmup_steps"].high == 40
    assert space.parent("ema.decay") == "ema" and space.parent("optimizer.lr") is None
    assert isinstance(space.distributions["scheduler"], CategoricalDistribution)
    installed = (ROOT / "conf" / "scheduler" / "wsd.yaml").is_file()
    assert ("wsd" in space.distributions["scheduler"].choices) == installed
    dropped = dict(space.dropped)
    assert installed or dropped["scheduler=wsd"].startswith("not in this install's config")


# -- one real study: killed with SIGKILL, continued by the same command -----------------------

#: Digits, a small MLP, a learning rate 10x below sgd's default (it misses the target within
#: its 3 epochs on the paired seeds: a miss counts at the samples it ran); the study searches the learning rate.
TASK = ["data=digits", "model=mlp", "model.hidden=[32]", "data.image_size=8", "data.channels=1",
        "trainer.max_epochs=3", "target.metric=val/acc", "target.value=0.8",
        "target.check_every_n_steps=5", "optimizer.lr=0.005", "trainer.enable_progress_bar=false"]  # fmt: skip
TRIALS = 4


def study_command(sweep_dir: Path) -> list[str]:
    return [str(ROOT / "run.py"), "-m", "experiment=autotune", "autotune.objective=time_to_target",
            f"autotune.budget_trials={TRIALS}", "autotune.seeds=2", "autotune.confirm=1",
            "autotune.trial_steps=4", "autotune.max_rounds=2",
            "autotune.params={optimizer.lr: 'tag(log, interval(2e-3, 0.3))'}",
            f"hydra.sweep.dir={sweep_dir}", *TASK]  # fmt: skip


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
    first = subprocess.Popen([*python(), *study_command(sweep_dir)], cwd=folder, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
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
    done = subprocess.run([*python(), *study_command(sweep_dir)], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
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
    finished = [t for t in study.trials if t.state.name in ("COMPLETE", "PRUNED")
                and not t.user_attrs.get("tuneup_baseline")]  # fmt: skip
    assert len(finished) == TRIALS
    jobs = [t.user_attrs["tuneup_job"] for t in finished]
    assert len(set(jobs)) == TRIALS  # each finished trial ran once
    for number, job in before.items():  # the ones finished before the kill were not run again
        assert study.trials[number].user_attrs["tuneup_job"] == job
    launched = [t for t in record["trials"] if t["label"] not in ("baseline", "speed")]
    assert not {t["job"] for t in launched} & set(before.values())
    assert "continued study 'autotune'" in " ".join(record["notes"])


def test_the_study_finds_a_higher_learning_rate_that_needs_fewer_samples(continued):
    record = continued["record"]
    [found] = record["recipe"]["found"]
    assert found.startswith("optimizer.lr=") and float(found.split("=")[1]) > 0.005
    rows = {r["label"]: r for r in record["confirmed"]}
    base, mine = rows["baseline"], rows[found]
    assert mine["decision"]["verdict"] == "better" and mine["decision"]["interval"]["high"] < 0
    for m, b in zip(mine["samples_to_target"], base["samples_to_target"], strict=True):
        assert m is not None and (b is None or m < b)  # None: missed within your own limits
    for row in record["confirmed"]:  # the figures are the runs' own, on the paired seeds
        for job, samples in zip(row["jobs"], row["samples_to_target"], strict=True):
            summary = json.loads((continued["dir"] / job / "summary.json").read_text())
            assert summary["samples_to_target"] == samples
    new_seed = record["recipe"]["samples_to_target_next_seed"]
    assert new_seed["low"] <= min(mine["samples_to_target"]) <= max(mine["samples_to_target"])
    assert max(mine["samples_to_target"]) <= new_seed["high"]
    speed = record["speed"]
    assert speed["rounds"] == 2 and speed["time_verdict"]  # paired, interleaved windows
    text = (continued["dir"] / "autotune.md").read_text()
    command = f"tuneup --config-dir {continued['dir'] / 'conf'} experiment=recipe target.stop=true"
    assert record["recipe"]["command"] == command and command in text
    assert "| better |" in text
    recipe = tuneup.compose(["experiment=recipe", "target.stop=true"],
                            config_dir=continued["dir"] / "conf")  # fmt: skip
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
        assert summary["pruned"]["step"] == trial["pruned_at_samples"] > 0  # samples seen
        assert summary["target_history"][-1]["samples"] == trial["pruned_at_samples"]
        assert not summary["target"]["reached"]
    text = (continued["dir"] / "autotune.md").read_text()
    assert f"| pruned | - | {pruned[0]['pruned_at_samples']} |" in text


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__]))
