"""experiment=autotune: the interval rule, the accuracy guard, pruning by the checks, the
interleaved rounds, the batch-size search, the measurement it reads, and one real search
whose recipe.yaml, autotune.md, autotune.png and autotune.json are held against its trials."""

from __future__ import annotations

import json
import math
import os
import random
import sys
import types
from pathlib import Path

import pytest
from omegaconf import OmegaConf

import tuneup
from tests.conftest import compose_config, run_cli
from tests.plugin_dists import make_distribution
from tests.report_tables import png_size
from tuneup.autotune.settings import Settings
from tuneup.autotune.space import Checks, Inspection
from tuneup.autotune.speed.batch import BatchSearch, MemoryModel, aligned
from tuneup.autotune.speed.guard import loss_gap, rejection
from tuneup.autotune.speed.outcome import ACCEPTED
from tuneup.autotune.speed.search import Budget, Search
from tuneup.autotune.trials import Trial, trial_settings
from tuneup.stats.interval import FASTER, NOISE, SLOWER, paired, t_quantile

MIB = 2**20

# -- the interval rule -----------------------------------------------------------------------


def test_t_quantiles_are_students():
    # two-sided 95%: the t table's 0.975 column
    for df, expected in {1: 12.7062, 2: 4.3027, 4: 2.7764, 30: 2.0423}.items():
        assert t_quantile(0.95, df) == pytest.approx(expected, abs=1e-4)


def simulated_rounds(rng, ratio: float, noise: float, rounds: int):
    """Trial speeds with log-normal noise of ``noise`` (sd of log speed) per trial."""
    reference = [100 * math.exp(rng.gauss(0, noise)) for _ in range(rounds)]
    candidate = [100 * ratio * math.exp(rng.gauss(0, noise)) for _ in range(rounds)]
    return reference, candidate


def test_a_real_speed_up_is_claimed_and_equal_speeds_rarely_are():
    rng = random.Random(0)
    claimed = [paired(*simulated_rounds(rng, 1.25, 0.03, 3), 0.95) for _ in range(200)]
    assert sum(i.verdict == FASTER for i in claimed) >= 190  # 1.25x against 3% noise
    assert sum(i.low <= 1.25 <= i.high for i in claimed) >= 180  # ~95% coverage
    false = [paired(*simulated_rounds(rng, 1.0, 0.10, 3), 0.95) for _ in range(2000)]
    rate = sum(i.verdict == FASTER for i in false) / len(false)
    assert rate < 0.045  # one-sided false claims: 2.5% expected at 95%


def test_one_round_gives_no_interval_and_slower_is_a_verdict():
    one = paired([100.0], [300.0], 0.95)
    assert (one.low, one.high, one.verdict) == (0.0, math.inf, NOISE)
    assert paired([100.0, 101.0], [50.0, 49.0], 0.95).verdict == SLOWER


# -- the search, on fake trials (no training: the speeds are known) ----------------------------


class FakeLab:
    """Trials whose summaries come from ``speed(overrides, job)``; what ran is kept in order."""

    def __init__(self, speed, curve=None, peak=None):
        self.speed, self.curve, self.peak = speed, curve, peak
        self.trials: list[Trial] = []

    def run(self, label, overrides, steps=None, limit_s=None):
        job = len(self.trials)
        speed = self.speed(overrides, job)
        summary = {
            "status": "ok",
            "samples_per_s": speed,
            "samples_per_s_windows": [speed * 0.9, speed],
            "loss_curve": (self.curve or (lambda o: {"samples": [64, 128], "loss": [2.3, 2.2]}))(
                overrides
            ),
            "peak_memory_bytes": self.peak(overrides) if self.peak else 100 * MIB,
            "memory_available_bytes": 1000 * MIB,
        }
        trial = Trial(label, tuple(overrides), str(job), Path(f"/nowhere/{job}"), summary, 1.0)
        self.trials.append(trial)
        return trial


class FakeChecks:
    """Every configuration composes and passes, except those in ``refused``."""

    def __init__(self, refused=(), batch=64):
        self.refused, self.batch = set(refused), batch

    def inspect(self, overrides):
        if any(o in self.refused for o in overrides):
            return Inspection(("refused for the test",), {})
        size = next(
            (int(o.split("=")[1]) for o in overrides if o.startswith("data.batch_size=")),
            self.batch,
        )
        config = OmegaConf.create(
            {"key": list(overrides), "data": {"batch_size": size}, "optimizer": {"lr": 0.1}}
        )
        return Inspection((), {"fake": {"overrides": list(overrides)}}, config)


def search(lab, space, checks=None, **settings):
    values = {"min_rounds": 2, "max_rounds": 2, "dimensions": tuple(space), **settings}
    chosen = Settings(space={k: [tuple(c.split()) for c in v] for k, v in space.items()}, **values)
    return Search(chosen, lab, checks or FakeChecks(), Budget(1e9)).run()


def labels(lab) -> list[str]:
    return [t.label for t in lab.trials]


def test_rounds_interleave_and_reverse_and_the_claimed_candidate_joins_the_recipe():
    def speed(overrides, job):
        if "a=1" in overrides:  # ahead in its first round, behind in its second
            return 110.0 if job < 5 else 95.0
        return {"b=2": 300.0, "c=3": 10.0}.get(overrides[-1] if overrides else "", 100.0)

    lab = FakeLab(speed)
    found = search(lab, {"x": ["a=1", "b=2", "c=3"]})
    assert labels(lab)[1:5] == ["baseline", "a=1", "b=2", "c=3"]
    assert labels(lab)[5:8] == ["b=2", "a=1", "baseline"]  # reversed; c=3 is out
    assert found.recipe == ("b=2",)
    outcomes = {o.label: o for o in found.outcomes}
    assert outcomes["b=2"].verdict == ACCEPTED
    assert outcomes["b=2"].interval.estimate == pytest.approx(3.0)
    assert "not faster beyond the noise" in outcomes["a=1"].reason
    assert "0.1x after 1 round(s): no later rounds could" in outcomes["c=3"].reason
    # a recipe of one step was measured against the baseline: no confirmation rounds
    assert len(lab.trials) == 8 and found.confirmation.interval(0.95).estimate == pytest.approx(3.0)


def test_a_recipe_of_two_steps_is_confirmed_against_the_baseline():
    lab = FakeLab(lambda overrides, job: 100.0 * 2 ** len(overrides))  # each step doubles
    found = search(lab, {"x": ["a=1"], "y": ["b=2"]})
    assert found.recipe == ("a=1", "b=2")
    assert labels(lab)[-4:] == ["baseline", "a=1 b=2", "a=1 b=2", "baseline"]
    assert found.confirmation.interval(0.95).estimate == pytest.approx(4.0)


def test_an_injected_10x_slowdown_of_one_repeat_claims_no_speed_up():
    # The candidate is exactly as fast as the reference, but one reference repeat ran 10x
    # slower (the machine was busy): the rounds disagree, so no speed-up may be claimed.
    slowed = {}

    def speed(overrides, job):
        if not overrides and not slowed and job > 0:
            slowed[job] = True
            return 10.0
        return 100.0

    lab = FakeLab(speed)
    found = search(lab, {"x": ["a=1"]}, max_rounds=4)
    [outcome] = found.outcomes
    assert outcome.interval.estimate > 1.5  # the slowdown shows in the estimate...
    assert outcome.interval.verdict == NOISE  # ...but not as a claim
    assert outcome.verdict != ACCEPTED and found.recipe == ()
    assert "no later rounds could make it faster beyond the noise" in outcome.reason


def test_the_guard_rejects_a_candidate_whose_loss_leaves_the_baselines():
    def curve(overrides):
        loss = [2.3, 9.0] if "lr=40" in overrides else [2.3, 2.2]
        return {"samples": [64, 128], "loss": loss}

    lab = FakeLab(lambda o, job: 500.0 if "lr=40" in o else 100.0, curve=curve)
    found = search(lab, {"x": ["lr=40"]})
    [outcome] = found.outcomes
    assert outcome.verdict == "rejected" and "loss curve leaves the baseline's by" in outcome.reason
    assert labels(lab).count("lr=40") == 1  # out at its first trial
    assert found.recipe == ()


def test_loss_curves_are_compared_at_equal_samples_seen():
    base = {"samples": [100, 200, 300, 400], "loss": [2.0, 1.8, 1.6, 1.4]}
    twice_the_batch = {"samples": [200, 400], "loss": [1.9, 1.5]}  # midpoints 100, 300
    assert loss_gap(base, twice_the_batch)[0] == pytest.approx(0.0, abs=1e-12)
    assert rejection(base, {"samples": [100, 200], "loss": [2.0, math.nan]}, 0.02).startswith(
        "its training loss is not finite"
    )


def test_refused_candidates_and_the_budget_never_launch_anything():
    lab = FakeLab(lambda o, job: 100.0)
    found = search(
        lab, {"x": ["bad=1"], "y": ["c=1"]}, checks=FakeChecks(refused={"bad=1"}), budget_minutes=1
    )
    assert all("bad=1" not in t.overrides for t in lab.trials)
    verdicts = {o.label: (o.verdict, o.reason) for o in found.outcomes}
    assert verdicts["bad=1"] == ("refused", "refused for the test")

    stingy = Search(found.settings, FakeLab(lambda o, job: 100.0), FakeChecks(), Budget(0.5))
    stingy.run()  # one trial (the baseline) costs 1 s of a 0.5 s budget
    assert [t.label for t in stingy.lab.trials] == ["baseline"]
    assert {o.verdict for o in stingy.outcomes} == {"not tried"}


def test_no_trial_is_allowed_past_the_budget():
    now = [0.0]
    lab = FakeLab(lambda o, job: 100.0)
    settings = Settings(dimensions=("x",), space={"x": [("c=1",)]}, budget_minutes=10)
    found = Search(settings, lab, FakeChecks(), Budget(600, clock=lambda: now[0]))
    found.baseline = lab.run("baseline", ())
    assert found.time_limit(("c=1",)) == 60  # a minute at least, well inside the budget
    now[0] = 590.0  # 10 s left: a trial gets those, not a minute (bench/race.py: 1 min -> 8.3),
    assert found.time_limit(("c=1",)) == 9  # less its start-up (the fastest trial took 1 s)


def test_batch_size_is_the_largest_multiple_of_8_that_fits_with_its_learning_rate():
    # peak = 100 MiB + 2 MiB per sample (1 MiB with checkpointing); the limit is 0.8 x 1000 MiB
    # available = 800 MiB: 350 fit -> 344; with checkpointing 700, capped at 8 x 64 = 512.
    def peak(overrides):
        per_sample = 1 if "activation_checkpointing=blocks" in overrides else 2
        return (100 + per_sample * _batch(overrides)) * MIB

    lab = FakeLab(lambda o, job: 100.0, peak=peak)
    settings = Settings(max_batch_factor=8, memory_headroom=0.2, lr_rule="linear")
    fake = types.SimpleNamespace(
        settings=settings, recipe=(), batch_notes=[], lab=lab, checks=FakeChecks(), not_tried=None
    )
    [plain, checkpointed] = BatchSearch(fake).candidates()
    assert plain.overrides == ("data.batch_size=344", f"optimizer.lr={0.1 * 344 / 64:.6g}")
    assert [_batch(t.overrides) for t in lab.trials[:3]] == [64, 128, 344]  # probes, then the pick
    assert checkpointed.overrides[:2] == ("activation_checkpointing=blocks", "data.batch_size=512")
    assert MemoryModel.from_probes((64, 228), (128, 356)).largest(800) == 350
    assert aligned(350) == 344 and aligned(3) == 8


def _batch(overrides) -> int:
    return next(int(o.split("=")[1]) for o in overrides if o.startswith("data.batch_size="))


# -- pruning with the real checks (composed, not built) --------------------------------------


def test_the_checks_prune_before_launching_on_this_cpu():
    def compose(overrides):
        # TINY, then these overrides; memoised per process (tests/conftest.py)
        return compose_config([*trial_settings(8), "trainer.accelerator=cpu", *overrides])

    space = {
        "precision": ["precision=bf16", "precision=tf32", "precision=amp"],
        "cudnn_benchmark": ["cudnn_benchmark=on"],
        "data_path": ["data_path=sync"],
        "kernels": ["kernels=[cross_entropy] kernels.require_triton=true"],
        "fused_optimizer": ["optimizer.fused=true"],
    }
    settings = Settings(space={k: [tuple(c.split()) for c in v] for k, v in space.items()})
    pruner = Search(settings, lab=None, checks=Checks(compose), budget=Budget(1e9))
    kept = []
    for dimension, candidates in settings.space.items():
        kept += pruner.prune([_candidate(dimension, c) for c in candidates])
    assert [c.label for c in kept] == ["precision=bf16"]
    why = {o.label: (o.verdict, o.reason) for o in pruner.outcomes}
    assert why["precision=tf32"][0] == "skipped" and "runs as fp32 here" in why["precision=tf32"][1]
    assert why["precision=amp"] == ("skipped", "runs as `precision=bf16` does here, which is tried")
    assert why["data_path=sync"][0] == "skipped"  # no prefetching to leave out on a CPU
    assert why["cudnn_benchmark=on"] == (
        "skipped",
        "cudnn_benchmark: none on cpu: cuDNN runs on CUDA only",
    )
    assert why["kernels=[cross_entropy] kernels.require_triton=true"][0] == "refused"
    assert "require_triton=true" in why["kernels=[cross_entropy] kernels.require_triton=true"][1]
    assert why["optimizer.fused=true"][0] == "refused"
    assert "does not compose" in why["optimizer.fused=true"][1]


def _pruned(allow_half_weights: bool) -> dict:
    def compose(overrides):
        # TINY, then these overrides; memoised per process (tests/conftest.py)
        return compose_config([*trial_settings(8), "trainer.accelerator=cpu", *overrides])

    settings = Settings(allow_half_weights=allow_half_weights)
    pruner = Search(settings, lab=None, checks=Checks(compose), budget=Budget(1e9))
    names = ("precision=fp16", "precision=fp16-true", "precision=bf16-true")
    kept = pruner.prune([_candidate("precision", (name,)) for name in names])
    return {c.label: "kept" for c in kept} | {o.label: o.reason for o in pruner.outcomes}


def test_fp16_on_a_cpu_and_pure_half_weights_are_never_launched():
    """Issue 32 points 6.7, 6.8: candidates the checks predict to lose, and pure half weights
    unless autotune.allow_half_weights=true."""
    why = _pruned(allow_half_weights=False)
    assert why["precision=fp16"].startswith("predicted to lose, precision: slower: precision=fp16")
    assert "about 75x" in why["precision=fp16"]
    assert "pure half weights" in why["precision=bf16-true"]
    assert "autotune.allow_half_weights=true" in why["precision=bf16-true"]
    opted_in = _pruned(allow_half_weights=True)
    assert opted_in["precision=bf16-true"] == "kept"  # the opt-in: launched
    assert "predicted to lose" in opted_in["precision=fp16-true"]  # still 75x slower here


def _candidate(dimension, overrides):
    from tuneup.autotune.space import Candidate

    return Candidate(dimension, overrides)


def test_bad_settings_name_the_key_and_what_is_allowed():
    with pytest.raises(
        tuneup.TuneupError, match=r"autotune.trial_steps=0 is not allowed: expected an integer >= 4"
    ):
        Settings.from_config(OmegaConf.create({"autotune": {"trial_steps": 0}}))
    with pytest.raises(tuneup.TuneupError, match=r"autotune\.dimensions has 'nope'"):
        Settings.from_config(OmegaConf.create({"autotune": {"dimensions": ["nope"]}}))


# -- what the measurement gives it -----------------------------------------------------------


def test_a_run_reports_speed_windows_a_loss_curve_and_device_hours(train):
    summary, _ = train("measure.windows=4")  # 256 samples / 32: 8 micro-batches, 6 measured
    assert len(summary["samples_per_s_windows"]) == 4
    assert all(w > 0 for w in summary["samples_per_s_windows"])
    curve = summary["loss_curve"]
    assert curve["samples"] == [32 * i for i in range(1, 9)]  # 8 points: <= 2 x windows
    assert curve["loss"][-1] == pytest.approx(summary["train_loss"], rel=1e-4)
    assert summary["device_hours"] > 0 and summary["gpu_hours"] == 0.0
    assert summary["memory_available_bytes"] > summary["peak_memory_bytes"] / 4
    assert "gpu_power_w" not in summary  # no NVIDIA GPU here


def test_loss_curve_buckets_merge_and_stay_bounded():
    import torch

    from tuneup.plugins.measure.loss_curve import LossCurve

    curve = LossCurve(4)
    for i in range(11):
        curve.add(torch.tensor(float(i)), 2)
    assert curve.values(world=2) == {"samples": [16, 32, 44], "loss": [1.5, 5.5, 9.0]}


def test_gpu_power_reads_the_nvml_energy_counter_or_samples_power():
    from tuneup.plugins.measure.power import GpuPower

    class FakeNvml:
        NVMLError = RuntimeError
        energy_mj = [1_000_000, 1_360_000]  # +360 J

        def nvmlDeviceGetTotalEnergyConsumption(self, handle):
            return self.energy_mj.pop(0)

    power = GpuPower(FakeNvml(), handle=None)
    power.start()
    power.stop()
    power.seconds = 1.2  # as if the fit took 1.2 s
    figures = power.figures(world=2)
    assert figures["gpu_power_w"] == pytest.approx(300.0)
    assert figures["gpu_energy_kwh"] == pytest.approx(2 * 360 / 3.6e6)

    class OldNvml(FakeNvml):  # no energy counter: the power draw is sampled off the thread
        def nvmlDeviceGetTotalEnergyConsumption(self, handle):
            raise RuntimeError("not supported")

        def nvmlDeviceGetPowerUsage(self, handle):
            return 250_000  # mW

    sampled = GpuPower(OldNvml(), handle=None, period_s=0.01)
    sampled.start()
    while len(sampled.watts) < 3:
        pass
    assert sampled.figures(world=1)["gpu_power_w"] == pytest.approx(250.0)


# -- one real search ---------------------------------------------------------------------------

#: A plugin (an installed distribution, so the trials in the sweep's process load it) that
#: replaces every trial's measured speed windows with a known speed: channels_last 3x, all
#: else 1x, so the winner is certain on a loaded machine. Everything else is real.
KNOWN_SPEEDS = """
from tuneup import hookimpl


class Plugin:
    def __init__(self, cfg):
        self.speed = 300.0 if cfg.memory_format.name == "channels_last" else 100.0

    @hookimpl(trylast=True)
    def report(self, summary):
        windows = summary.get("samples_per_s_windows") or []
        summary["samples_per_s_windows"] = [self.speed] * len(windows)
"""

SMALL = [
    "data.train_samples=256",
    "data.val_samples=32",
    "data.image_size=8",
    "model.width=4",
    "data.batch_size=16",
    "trainer.enable_progress_bar=false",
]


PROCESS = """
import os
from tuneup import hookimpl


class Plugin:
    @hookimpl
    def report(self, summary):
        summary["test_parent_pid"] = os.getppid()
"""


def autotune_site(tmp_path):
    """known_speeds (channels_last 3x) and a plugin that records the trial's parent process."""
    return make_distribution(
        tmp_path / "site",
        "autotune-probes",
        {"known_speeds": KNOWN_SPEEDS, "process_probe": PROCESS},
        {"known_speeds": "known_speeds:Plugin", "process_probe": "process_probe:Plugin"},
    )


def test_autotune_end_to_end_prunes_interleaves_guards_and_answers(tmp_path):
    """One real search, run through hydra/launcher=joblib as docs/autotune.md gives it, so
    that it also holds the launcher's promises: every trial in a worker process of the sweep,
    not in the sweep's own (a basic-launcher trial's parent would be this test), one at a time,
    with the threads the shell gave. The basic launcher's real search to a target:
    test_autotune_study.py."""
    sweep_dir = tmp_path / "sweep"
    done = run_cli(
        "-m",
        "experiment=autotune",
        f"hydra.sweep.dir={sweep_dir}",
        *SMALL,
        "autotune.trial_steps=6",
        "autotune.max_rounds=2",
        "autotune.budget_minutes=20",
        "autotune.dimensions=[precision,memory_format,diverge,kernels,fused_optimizer]",
        "autotune.space.precision=['precision=tf32']",
        "+autotune.space.diverge=['optimizer.lr=1000']",
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2",
        cwd=tmp_path,
        tiny=False,
        env={"PYTHONPATH": str(autotune_site(tmp_path)), "OMP_NUM_THREADS": "2"},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    record = json.loads((sweep_dir / "autotune.json").read_text())
    path = {o["label"]: o for o in record["path"]}

    # joblib: each trial in a worker process (not this test's child), with the shell's threads
    parents = {
        json.loads((sweep_dir / t["job"] / "summary.json").read_text())["test_parent_pid"]
        for t in record["trials"]
    }
    assert len(record["trials"]) >= 5 and os.getpid() not in parents
    for trial in record["trials"]:
        summary = json.loads((sweep_dir / trial["job"] / "summary.json").read_text())
        assert "2 threads" in summary["device"], summary["device"]

    # Pruned by the checks (or by no effect here): never launched.
    assert path["precision=tf32"]["verdict"] == "skipped"
    assert path["kernels=[cross_entropy] kernels.require_triton=true"]["verdict"] == "refused"
    assert path["optimizer.fused=true"]["verdict"] == "refused"
    launched = [
        OmegaConf.load(sweep_dir / t["job"] / ".hydra" / "overrides.yaml") for t in record["trials"]
    ]
    assert not any("optimizer.fused=true" in o or "precision=tf32" in o for o in launched)

    # Interleaved rounds, then the guard: lr=1000 is out at its first trial.
    order = [t["label"] for t in record["trials"]]
    assert order[:5] == [
        "baseline",
        "baseline",
        "memory_format=channels_last",
        "memory_format=channels_last",
        "baseline",
    ]
    diverge = path["optimizer.lr=1000"]
    assert (
        diverge["verdict"] == "rejected" and "loss curve leaves the baseline's" in diverge["reason"]
    )
    assert len(diverge["trials"]) == 1

    # The answer: channels_last, 3x, confirmed against the baseline.
    assert record["recipe"]["found"] == ["memory_format=channels_last"]
    assert path["memory_format=channels_last"]["verdict"] == "accepted"
    assert record["speed_up"]["estimate"] == pytest.approx(3.0)
    for trial in record["trials"]:  # the files agree with the trials' own summaries
        summary = json.loads((sweep_dir / trial["job"] / "summary.json").read_text())
        assert trial["status"] == summary["status"]
        assert trial["speed"] == max(summary["samples_per_s_windows"])
        assert trial["peak_memory_bytes"] == summary["peak_memory_bytes"]
    markdown = (sweep_dir / "autotune.md").read_text()
    assert "**Recipe: `memory_format=channels_last`**: 3x [3, 3] the baseline's speed" in markdown
    assert "| optimizer.lr=1000 |" not in markdown and "`optimizer.lr=1000`" in markdown
    assert png_size(sweep_dir / "autotune.png")[0] == 1500
    console = done.stdout + done.stderr  # a line per trial, not its summary table
    assert console.count("summary written to") == len(record["trials"])
    assert "step_time_ms.p50" not in console
    assert (sweep_dir / "report.md").is_file()  # the sweep report lists every trial too

    # recipe.yaml is a preset that trains with the winner's overrides.
    cfg = tuneup.compose(
        ["experiment=recipe", "trainer.max_epochs=1"], config_dir=sweep_dir / "conf"
    )
    assert (cfg.memory_format.name, cfg.model.width, cfg.data.image_size) == ("channels_last", 4, 8)
    tuneup.run(cfg, run_dir=tmp_path / "full")
    assert json.loads((tmp_path / "full" / "summary.json").read_text())["status"] == "ok"


#: The smallest search that still decides: channels_last against the baseline, two rounds
#: (tests/test_slurm.py runs it).
ONE_DIMENSION = [
    "-m",
    "experiment=autotune",
    *SMALL,
    "autotune.trial_steps=4",
    "autotune.min_rounds=2",
    "autotune.max_rounds=2",
    "autotune.dimensions=[memory_format]",
]


def test_a_sweep_of_values_is_refused(tmp_path):
    from tuneup.autotune.sweeper import single_command

    with pytest.raises(tuneup.TuneupError, match="takes one command, not a sweep"):
        single_command(["precision=fp32,bf16"])
    assert single_command(["precision=bf16"]) == ["precision=bf16"]


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__]))


def test_a_larger_batch_scales_the_lightningmodules_own_lr_not_tuneups(monkeypatch):
    """A LightningModule with its own configure_optimizers reads no optimizer.lr: the batch
    dimension scales its model.lr where the config gives one, else keeps the lr and says so."""
    from tuneup.autotune.speed import batch

    cfg = OmegaConf.create({"model": {"lr": 0.1}, "optimizer": {"lr": 0.05}})
    monkeypatch.setattr(batch, "own_loop", lambda config: False)
    assert batch.lr_overrides(cfg, 2.0, "linear")[0] == ("optimizer.lr=0.1",)
    monkeypatch.setattr(batch, "own_loop", lambda config: True)
    assert batch.lr_overrides(cfg, 2.0, "linear") == (
        ("model.lr=0.2",),
        "model.lr 0.1 -> 0.2 (linear scaling, x2 batch)",
    )
    kept = batch.lr_overrides(
        OmegaConf.create({"model": {}, "optimizer": {"lr": 0.05}}), 2.0, "linear"
    )
    assert kept == ((), "lr kept: the LightningModule builds its own optimizer (no model.lr)")
