"""experiment=autotune autotune.objective=time_to_target: candidates trained to the target over
seeds, ranked by time to target (not reached last), losers stopped at the best's time; and the
candidates autotune never launches: those its checks predict to lose (fp16 on a CPU), and pure
half weights unless autotune.allow_half_weights=true (issue 32 points 6.7, 6.8)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests.conftest import compose_config, run_cli
from tuneup.autotune.race import RaceSearch
from tuneup.autotune.search import Budget, Search
from tuneup.autotune.settings import Settings
from tuneup.autotune.space import Candidate, Checks, Inspection
from tuneup.autotune.trials import Trial, trial_settings

# -- never launched: predicted to lose, or pure half weights --------------------------------


def _pruned(allow_half_weights: bool) -> dict:
    def compose(overrides):
        # TINY, then these overrides; memoised per process (tests/conftest.py)
        return compose_config([*trial_settings(8), "trainer.accelerator=cpu", *overrides])

    settings = Settings(allow_half_weights=allow_half_weights)
    pruner = Search(settings, lab=None, checks=Checks(compose), budget=Budget(1e9))
    names = ("precision=fp16", "precision=fp16-true", "precision=bf16-true")
    kept = pruner.prune([Candidate("precision", (name,)) for name in names])
    return {c.label: "kept" for c in kept} | {o.label: o.reason for o in pruner.outcomes}


def test_fp16_on_a_cpu_and_pure_half_weights_are_never_launched():
    why = _pruned(allow_half_weights=False)
    assert why["precision=fp16"].startswith("predicted to lose, precision: slower: precision=fp16")
    assert "about 75x" in why["precision=fp16"]
    assert "pure half weights" in why["precision=bf16-true"]
    assert "autotune.allow_half_weights=true" in why["precision=bf16-true"]
    opted_in = _pruned(allow_half_weights=True)
    assert opted_in["precision=bf16-true"] == "kept"  # the opt-in: launched
    assert "predicted to lose" in opted_in["precision=fp16-true"]  # still 75x slower here


# -- the race on fake trials (the times are known) --------------------------------------------


class FakeLab:
    """Trials whose time to target is ``times[label][seed]`` (None: not reached)."""

    def __init__(self, times):
        self.times, self.trials, self.settings = times, [], []

    def run(self, label, overrides, steps=None, limit_s=None, settings=None):
        seed = int(next(o for o in overrides if o.startswith("seed=")).split("=")[1])
        time = self.times[label][seed]
        summary = {"status": "ok", "target": {"reached": time is not None, "best": 0.5},
                   "time_to_target_s": time, "steps_to_target": 10, "samples_to_target": 640}  # fmt: skip
        job = len(self.trials)
        self.trials.append(Trial(label, tuple(overrides), str(job), Path("/no"), summary, 1.0))
        self.settings.append(settings)
        return self.trials[-1]


class FakeChecks:
    def inspect(self, overrides):
        config = OmegaConf.create({"key": list(overrides), "target": {"metric": "val/acc",
                                   "value": 0.9}, "precision": {"name": "fp32"}})  # fmt: skip
        return Inspection((), {"fake": {"overrides": list(overrides)}}, config)


def test_the_race_ranks_by_time_to_target_over_seeds_and_stops_losers_at_the_best_time():
    times = {"baseline": {5: 10.0, 6: 12.0}, "a=1": {5: 6.0, 6: 7.0},
             "b=2": {5: 4.0, 6: None}, "c=3": {5: 8.0, 6: 9.0}}  # fmt: skip
    lab = FakeLab(times)
    settings = Settings(seeds=2, race_margin=1.5, race_dimensions=("x",),
                        space={"x": [("a=1",), ("b=2",), ("c=3",)]})  # fmt: skip
    found = RaceSearch(settings, lab, FakeChecks(), Budget(1e9), seed=5).run()
    assert found.recipe == ("a=1",)
    assert [t.label for t in lab.trials] == [
        "baseline",
        "baseline",
        "a=1",
        "a=1",
        "b=2",
        "b=2",
        "c=3",
        "c=3",
    ]
    assert [o for o in lab.trials[1].overrides] == ["seed=6"]  # the seeds vary
    assert lab.settings[0][-1] == "measure.console_table=false"  # the baseline: no time limit
    assert lab.settings[2][-1] == "++trainer.max_time=00:00:00:18"  # baseline's slowest 12 x 1.5
    assert lab.settings[4][-1] == lab.settings[6][-1] == "++trainer.max_time=00:00:00:11"  # 7 x 1.5
    ranking = [(e.overrides, e.reached) for e in found.rank()]
    assert ranking == [(("a=1",), True), (("c=3",), True), ((), True), (("b=2",), False)]
    why = {o.label: (o.verdict, o.reason) for o in found.outcomes}
    assert why["a=1"][0] == "accepted" and why["c=3"][0] == "rejected"
    assert why["b=2"][1].startswith("did not reach the target in seed=6")
    interval = found.recipe_entry().as_dict(0.95)["interval"]
    assert interval["estimate"] == pytest.approx(6.5) and interval["low"] < 6 < 7 < interval["high"]


# -- one real race: digits, a small mlp, 2 seeds, 2 candidates ----------------------------------

RACE = ["data=digits", "model=mlp", "model.hidden=[32]", "data.image_size=8", "data.channels=1",
        "trainer.max_epochs=6", "target.metric=val/acc", "target.value=0.8",
        "target.check_every_n_steps=5", "trainer.enable_progress_bar=false"]  # fmt: skip


def test_autotune_time_to_target_returns_a_recipe_that_reached_the_target(tmp_path):
    sweep_dir = tmp_path / "sweep"
    done = run_cli(
        "-m", "experiment=autotune", "autotune.objective=time_to_target",
        "autotune.method=greedy", "autotune.seeds=2", f"hydra.sweep.dir={sweep_dir}", *RACE,
        "autotune.race_dimensions=[label_smoothing,slow,batch_size,precision]",
        "+autotune.space.slow=['optimizer.lr=0.0001']",
        "autotune.space.precision=['precision=fp16','precision=bf16-true']",
        cwd=tmp_path, tiny=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    record = json.loads((sweep_dir / "autotune.json").read_text())
    recipe = record["recipe"]["time_to_target"]
    assert recipe["reached"] and recipe["runs"] == 2 and len(recipe["time_to_target_s"]) == 2
    interval = recipe["interval"]
    assert interval["low"] <= interval["estimate"] <= interval["high"]
    for trial in record["trials"]:  # the figures are the trials' own
        summary = json.loads((sweep_dir / trial["job"] / "summary.json").read_text())
        assert trial["time_to_target_s"] == summary.get("time_to_target_s")
    raced = [t for t in record["trials"] if t["reached"] is not None]  # not the memory probes
    assert {t["overrides"][-1] for t in raced} == {"seed=0", "seed=1"}
    ranking = {e["label"]: (number, e) for number, e in enumerate(record["ranking"])}
    [(number, slow)] = [v for k, v in ranking.items() if k.endswith("optimizer.lr=0.0001")]
    # lr 1e-4 (on the recipe so far) does not get there: ranked after those that did
    assert (slow["reached"], slow["runs"]) == (False, 1)  # its seed 1 not run
    flags = [e["reached"] for e in record["ranking"]]
    assert flags == sorted(flags, reverse=True) and not flags[number]  # reached ones first
    batch = next(o for o in record["path"] if o["dimension"] == "batch_size")
    assert batch["trials"] and "optimizer.lr=" in batch["label"]  # raced with its lr, after probes
    never = {o["label"]: o["reason"] for o in record["path"] if not o["trials"]}
    assert "predicted to lose" in never["precision=fp16"]
    assert "allow_half_weights" in never["precision=bf16-true"]
    markdown = (sweep_dir / "autotune.md").read_text()
    assert "optimizer.lr=0.0001` | not reached |" in markdown
    text = (sweep_dir / "conf" / "experiment" / "recipe.yaml").read_text()
    assert "value: 0.8" in text and "autotune" not in text.split("\n", 3)[-1]
