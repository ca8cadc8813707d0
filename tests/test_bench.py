"""The benchmark scripts' set-up, on CPU (they measure on a GPU: bench/gpu.sh, docs/benchmarks.md)."""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, bench_module


def test_precision_bench_data_do_not_grow_with_the_steps():
    """50 steps at batch 256 generated 12,800 ResNet-50 images per run, and the default CUDA
    run did not finish in 5 minutes: the runs now cycle over at most 10 batches."""
    precision = bench_module("precision")
    args = precision.parse(["--device", "cuda", "--steps", "500"])
    assert args.batch_size == 256 and args.model == "resnet50"
    run = precision.overrides(args, "fp32", Path("run"))
    assert "data.train_samples=2560" in run  # 10 batches
    assert "trainer.max_steps=500" in run and "trainer.max_epochs=-1" in run


def test_precision_bench_prints_every_choice_and_exits_1_when_one_failed(monkeypatch, capsys):
    """bench/gpu.sh counts a benchmark as failed by its exit code."""
    precision = bench_module("precision")

    def run_one(args, choice, run_dir):
        if choice == "bf16":
            return {"choice": choice, "error": "RuntimeError: out of memory"}
        return {
            "choice": choice,
            "ran_as": choice,
            "samples_per_s": 100.0,
            "note": None,
            "peak_memory_bytes": 2**30,
            "data_wait_fraction": 0.01,
            "device": "cpu",
        }

    monkeypatch.setattr(precision, "run_one", run_one)
    with pytest.raises(SystemExit) as exit_:
        precision.main(["--device", "cpu", "--choices", "fp32,bf16"])
    assert exit_.value.code == 1
    rows = {
        line.split("|")[1].strip(): line
        for line in capsys.readouterr().out.splitlines()
        if line.startswith("| ") and not line.startswith("| precision")
    }
    assert "| 100.0 |" in rows["fp32"] and "failed: RuntimeError: out of memory" in rows["bf16"]


def test_gpu_script_lists_every_step_and_refuses_unknown_ones():
    listed = subprocess.run(
        ["bash", str(ROOT / "bench" / "gpu.sh"), "--list"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    steps = [line.split(":")[0] for line in listed.stdout.splitlines()]
    assert steps == [
        "gpu-tests",
        "suite",
        "throughput",
        "precision",
        "memory",
        "kernels",
        "dataloader",
        "syncs",
        "micro-batch",
    ]
    quick = subprocess.run(
        ["bash", str(ROOT / "bench" / "gpu.sh"), "quick", "--list"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    commands = dict(line.split(": ", 1) for line in quick.stdout.splitlines())
    assert commands["kernels"].endswith("bench/kernels.py --only ce,lce,fp8")  # no optim section
    assert "--configs amp,amp+channels_last" in commands["throughput"]
    unknown = subprocess.run(
        ["bash", str(ROOT / "bench" / "gpu.sh"), "nope"], capture_output=True, text=True, timeout=60
    )
    assert unknown.returncode == 2 and "unknown step 'nope'" in unknown.stderr


def test_memory_bench_parallel_layouts_compose_with_the_processes_and_mesh_they_name(make_config):
    """Each row of the model-parallel table is a run Hydra accepts (no group given twice),
    on CPU processes, with AdamW, fp32 but for the bf16 row."""
    memory = bench_module("memory_parallel")
    args = memory.parse(["--smoke"])
    assert args.steps == 2
    for layout, (processes, _) in memory.LAYOUTS.items():
        cfg = make_config(memory.parallel_overrides(args, layout, Path("run")), tiny=False)
        assert cfg.trainer.devices == processes and cfg.trainer.accelerator == "cpu"
        assert cfg.optimizer.name == "adamw" and cfg.model.width == 16
        assert cfg.precision.name == ("bf16" if "bf16" in layout else "fp32")
        tp = cfg.strategy.get("tensor_parallel_size", 1)
        assert (cfg.strategy.name, tp) == {
            "1 process": ("auto", 1),
            "DDP x2": ("ddp", 1),
            "TP x2": ("fsdp", 2),
            "FSDP x2 over TP x2": ("fsdp", 2),
        }.get(layout, ("fsdp", 1))
    with pytest.raises(SystemExit):
        memory.parse(["--layouts", "FSDP x3"])


def test_memory_bench_parallel_table_shows_rank_zero_and_where_ranks_differ():
    memory = bench_module("memory_parallel")
    mib = 2**20
    one = {
        "parameter_bytes": 4 * mib,
        "gradient_bytes": 4 * mib,
        "optimizer_state_bytes": 8 * mib,
        "peak_memory_bytes": 600 * mib,
    }
    half = {
        **{k: v // 2 for k, v in one.items()},
        "all_gather_bytes_per_step": 6 * mib,
        "reduce_scatter_bytes_per_step": 4 * mib,
        "all_reduce_bytes_per_step": 0,
    }
    rows = [
        {"layout": "1 process", "processes": 1, "per_rank": [{"rank": 0, **one}]},
        {
            "layout": "FSDP x2",
            "processes": 2,
            "per_rank": [{"rank": 0, **half}, {"rank": 1, **half, "parameter_bytes": 3 * mib}],
        },
        {"layout": "FSDP x4", "processes": 4, "error": ["error: gloo timed out"]},
    ]
    lines = memory.parallel_table(rows).splitlines()
    assert lines[2].split(" | ")[2:] == [
        "4.0 MiB",
        "4.0 MiB",
        "8.0 MiB",
        "1.00x",
        "600",
        "0",
        "0",
        "0 |",
    ]
    assert lines[3].split(" | ")[2:] == [
        "2.0 MiB (ranks 2.0 MiB-3.0 MiB)",
        "2.0 MiB",
        "4.0 MiB",
        "0.50x",
        "300 / 300",
        "6.0 MiB",
        "4.0 MiB",
        "0 |",
    ]
    assert "failed: error: gloo timed out" in lines[4]


def test_memory_bench_parallel_smoke_reads_each_ranks_figures_from_a_real_fsdp_run(
    monkeypatch, capsys
):
    """The table's figures are the ones a real run's summary.json writes under per_rank."""
    from tests.conftest import python

    memory = bench_module("memory_parallel")
    monkeypatch.setattr(memory, "PYTHON", python())
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    memory.main(["--smoke", "--layouts", "FSDP x2"])
    row = next(line for line in capsys.readouterr().out.splitlines() if "| FSDP x2 |" in line)
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells[1] == "2" and "failed" not in row and "ranks" not in row  # ranks hold alike
    assert all(cell.endswith("KiB") for cell in cells[2:5] + cells[7:9])  # held; gathered, reduced
    # no 1-process row; FSDP all-reduces only the logged loss's mean (one float32)
    assert cells[5] == "-" and cells[9] == "0.0 KiB"
    assert len(cells[6].split(" / ")) == 2  # both ranks' peak RSS


def test_memory_startup_bench_says_whether_the_sum_is_within_one_copy_and_the_shards():
    """The goal of issue 31: the processes' peaks, less the runtime's, at most two copies of
    the model (one whole, plus the shards); the model's size is the full run's parameters."""
    startup = bench_module("memory_startup")
    gib = 2**30

    def row(variant, *peaks, params=gib // 8):  # fp32: a model of 0.5 GiB
        return {
            "variant": variant,
            "seconds": 1.0,
            "ranks": [
                {"rank": r, "peak_rss_bytes": p, "parameters": params} for r, p in enumerate(peaks)
            ],
        }

    rows = [
        row("runtime", gib // 2, gib // 2),
        row("before (full)", gib, gib),
        row("broadcast", gib + gib // 4, gib // 2 + gib // 4 + 1),
    ]
    text, note = startup.table(rows)
    lines = text.splitlines()
    assert "0.50 GiB in fp32" in note and "<= 1.00 GiB" in note
    assert lines[3].split(" | ")[1:5] == ["1.00 / 1.00", "2.00", "1.00", "yes"]
    assert lines[4].split(" | ")[4] == "no (0.00 GiB over)"  # one byte over is over


def test_save_every_step_bench_runs_both_ways_and_restores_pruning(capsys):
    """bench/save_every_step.py at its smallest: both rows; pruning and logging as they were."""
    import logging

    from tuneup.trainer.state import checkpoint_io, checkpoints

    scan, remember = checkpoints.scan, checkpoint_io.remember_written
    bench_module("save_every_step").main(["--runs", "1", "--epochs", "1"])
    out = capsys.readouterr().out
    assert (
        "| reads each new file once (now) |" in out and "| reads every kept file (before) |" in out
    )
    assert "CPU-ms a save" in out
    assert (checkpoints.scan, checkpoint_io.remember_written) == (scan, remember)
    assert logging.root.manager.disable == logging.NOTSET


# -- bench/race.py: the race on tasks the search was not tuned on (issue 50) -----------------


def test_race_has_six_tasks_or_more_each_passing_the_checks_without_training(tmp_path, monkeypatch):
    race = bench_module("race")
    tasks = race.race_tasks
    assert len(tasks.TASKS) >= 6 and {"digits", "python_source"} <= set(tasks.TASKS)
    assert all(task["step_hint"] > 0 for task in tasks.TASKS.values())
    monkeypatch.chdir(tmp_path)  # `--out race`: a folder relative to where the race starts
    assert tasks.problems(list(tasks.TASKS), Path("race"), None) == []
    corpus = tmp_path / "race" / "python_reference.txt"
    assert corpus.stat().st_size > 100_000  # the corpus, written
    # the searches run from the checkout: a task's corpus is named by its absolute path
    assert f"data.path={corpus}" in tasks.command("python_reference", Path("race"))
    trials = race.race_runs.algoperf_trials(200, gpt=True)  # AlgoPerf v0.5.0's five points
    assert len(trials) == 5 and all("trainer.max_steps=200" in t for t in trials)
    assert "scheduler.warmup_steps=20" in trials[0] and "model.dropout=0.1" in trials[4]
    assert (
        "label_smoothing=on" not in trials[2] and "optimizer.betas=[0.863744,0.629185]" in trials[3]
    )
    smoke = race.parse(["--smoke"])
    assert smoke.tasks == list(tasks.SMOKE_TASKS) and smoke.seeds == [10]
    assert race.parse([]).runs == ["default", "hand", "algoperf", "random", "autotune"]


def test_race_search_writes_its_sweep_under_a_relative_out_folder(tmp_path, monkeypatch):
    """A search runs from the checkout; with `--out race` its sweep still lands in the race's
    folder, where the race reads the pick."""
    runs = bench_module("race").race_runs
    monkeypatch.chdir(tmp_path)
    sweep = tmp_path / "race" / "autotune0"

    def run(args, **kwargs):
        assert f"hydra.sweep.dir={sweep}" in args and kwargs["cwd"] == runs.ROOT
        sweep.mkdir(parents=True)
        recipe = {"found": ["optimizer=muon"], "samples_to_target_next_seed": [1, 2]}
        (sweep / "autotune.json").write_text(json.dumps({"recipe": recipe, "verdict": "v"}))
        return subprocess.CompletedProcess(args, 0, "", "")

    monkeypatch.setattr(runs.subprocess, "run", run)
    assert runs.search(["model=mlp"], [], Path("race/autotune0")) == (
        ["optimizer=muon"],
        "v",
        [1, 2],
    )


def test_race_reads_the_frozen_search_settings_and_refuses_changed_ones(tmp_path):
    tasks = bench_module("race").race_tasks
    frozen = tasks.load_frozen()
    assert frozen["frozen"] and frozen["sha256"] == tasks.sha256(tasks.FROZEN)
    assert frozen["settings"]["budget_minutes"] == 10 and len(frozen["sampler_seeds"]) == 3
    random = tasks.search_overrides(frozen, "random", 2)
    assert "autotune.sampler=random" in random and "autotune.budget_trials=100" in random
    assert random[-1] == "autotune.sampler_seed=2" and random[0] == "experiment=autotune"
    edited = tmp_path / "race_frozen.yaml"
    edited.write_text(tasks.FROZEN.read_text().replace("budget_minutes: 10", "budget_minutes: 5"))
    with pytest.raises(SystemExit, match=r"not the frozen .*pass --unfrozen"):
        tasks.load_frozen(edited)
    with pytest.raises(SystemExit, match="--set budget_minutes=3 changes the frozen"):
        tasks.load_frozen(changes=("budget_minutes=3",))
    loose = tasks.load_frozen(edited, unfrozen=True, changes=("budget_trials=7",))
    assert not loose["frozen"] and loose["settings"]["budget_minutes"] == 5
    assert loose["settings"]["budget_trials"] == 7


def test_race_profile_counts_the_tasks_within_tau_of_the_best_and_a_miss_never(tmp_path):
    report = bench_module("race").race_report

    def result(task, **steps):  # one seed each; every recipe 0.1 s a step
        rows = [
            {
                "contender": name,
                "label": name,
                "overrides": [],
                "summaries": [{"steps_to_target": value, "samples_to_target": value}],
            }
            for name, value in steps.items()
        ]
        speed = {name: {"seconds_per_step": 0.1} for name in steps}
        return {"task": task, "command": "-", "rows": rows, "speed": speed, "notes": []}

    results = [result("a", default=100, autotune=50), result("b", default=100, autotune=None)]
    assert report.profile(results, taus=(1, 2)) == {"default": [0.5, 1.0], "autotune": [0.5, 0.5]}
    assert "- b, autotune, seed 10: missed" in "\n".join(report.misses(results, [10]))
    results[0]["rows"][1]["interval"] = {"estimate": 50, "low": 40, "high": 45}  # 50: outside
    assert (
        "- autotune: stated new-seed interval [40, 45] samples holds 0 of 1 unseen seeds (50)"
        in (report.task_table(results[0]))
    )
    report.profile_png(results, tmp_path / "profile.png")
    assert (tmp_path / "profile.png").read_bytes()[:4] == b"\x89PNG"
    judge = bench_module("race").race_goals
    goals = "\n".join(judge.goals(results))
    assert (
        "median pick in no more time than every other contender, on every task: NOT met (b:"
        in goals
    )
    assert (
        "autotune_steps's median pick in no more steps than every other contender, on every task: not measured"
        in goals
    )
    assert "worst of autotune's searches never slower than the default: NOT met (b (missed" in goals
    assert "hold at least 80 % of the unseen re-runs: NOT met (0 of 1, 0%)" in goals
    assert (
        "at least 1.5x faster than the default over the tasks (geometric mean): NOT met (a pick "
        "missed where the default reached)" in goals
    )
    flipped = [result("c", default=None, autotune=50), result("d", default=None, autotune=None)]
    assert (
        "(geometric mean): met (the default missed on a task where the pick reached) "
        "(neither reached the target on d)" in "\n".join(judge.goals(flipped))
    )
    assert "1.5x faster than the default over the tasks (geometric mean): met (2.00x)" in "\n".join(
        judge.goals(results[:1])
    )


def test_race_compares_two_picks_with_the_timing_noise_of_their_paired_window():
    judge = bench_module("race").race_goals

    def row(contender, label, steps):
        summaries = [{"steps_to_target": s, "samples_to_target": s} for s in steps]
        return {"contender": contender, "label": label, "overrides": [], "summaries": summaries}

    rows = [
        row("default", "default", [60, 70, 80]),
        *(row("random", f"random #{i}", s) for i, s in enumerate([[20] * 3, [30] * 3, [None] * 3])),
        *(
            row("autotune", f"autotune #{i}", s)
            for i, s in enumerate([[30] * 3, [15] * 3, [40] * 3])
        ),
    ]
    # samples/s per round; batch 64 except the picks at 128; random #1's window spread wide
    noisy = {"speeds": [60.0, 140.0, 70.0, 150.0, 90.0], "batch": 64}
    speed = {
        "default": {"speeds": [100.0, 100.0, 100.0, 100.0, 100.0], "batch": 64},
        "random #0": {"speeds": [100.0, 101.0, 99.0, 100.0, 100.0], "batch": 64},
        "random #1": noisy,
        "random #2": {"speeds": [100.0] * 5, "batch": 64},
        "autotune #0": {"speeds": [200.0, 200.0, 200.0, 200.0, 200.0], "batch": 128},
        "autotune #1": {"speeds": [200.0] * 5, "batch": 128},
        "autotune #2": {"speeds": [200.0] * 5, "batch": 128},
    }
    for entry in speed.values():
        entry["seconds_per_step"] = entry["batch"] / statistics.median(entry["speeds"])
    result = {"task": "t", "command": "-", "rows": rows, "speed": speed, "notes": []}
    # the median picks: autotune #0 (30 steps at 0.64 s), random #1 (30 at 64 / 90 s)
    assert judge.median_row(result, "autotune")["label"] == "autotune #0"
    assert judge.median_row(result, "random")["label"] == "random #1"
    level = judge.time_ratio(result, "autotune", "random")
    assert (
        level["verdict"] == "level within the timing's noise" and level["low"] < 1 < level["high"]
    )
    faster = judge.time_ratio(result, "autotune", "default")  # 30 x 0.64 s against 70 x 0.64 s
    assert faster["estimate"] == pytest.approx(30 / 70) and faster["low"] == faster["high"]
    assert faster["verdict"] == "faster beyond the timing's noise"
    table = "\n".join(judge.against_table([result]))
    assert (
        "| t | default | 30; 70 | 0.43 [0.43, 0.43] | faster beyond the timing's noise |" in table
    )
    speed["random #1"] = {**noisy, "speeds": [200.0] * 5, "seconds_per_step": 0.32}
    goals = "\n".join(judge.goals([result]))  # random's median now #0: 20 steps x 0.64 s
    assert "NOT met (t: random 12.800 < 19.200 (time ratio 1.50 [1.4" in goals
    assert "slower beyond the timing's noise" in goals
    speed["random #0"]["window"] = "elsewhere"  # timed in another run's window: not paired
    assert judge.time_ratio(result, "autotune", "random") is None
    assert "| t | random | 30; 20 | - | timed in other windows, not paired" in "\n".join(
        judge.against_table([result])
    )


def test_race_tells_the_searches_own_spread_by_a_permutation_over_them():
    judge = bench_module("race").race_goals

    def result(random, autotune):
        rows, speed = [], {}
        for contender, steps in (("random", random), ("autotune", autotune)):
            for i, n in enumerate(steps):
                label = f"{contender} #{i}"
                summaries = [{"steps_to_target": n, "samples_to_target": n}] * 3
                rows.append({"contender": contender, "label": label, "summaries": summaries})
                speed[label] = {"seconds_per_step": 0.5}
        return {"task": "t", "rows": rows, "speed": speed}

    # autotune's three picks the three slowest: of the 20 ways to deal six picks three and
    # three, 2 put the medians as far apart (swapping autotune's fastest with random search's
    # slowest moves neither median): 0.10, the smallest p-value of three searches against three
    slowest = judge.searches_apart(result([4, 4, 5], [6, 7, 8]), "autotune", "random")
    assert slowest["p"] == pytest.approx(2 / 20) and slowest["splits"] == 20
    assert slowest["mine"] == [3.0, 3.5, 4.0] and slowest["other"] == [2.0, 2.0, 2.5]
    assert judge.searches_apart(result([6, 7, 8], [4, 4, 5]), "autotune", "random")["p"] == 1.0
    # a miss is slower than every hit: autotune's missed pick counts as its slowest
    missed = judge.searches_apart(result([4, 5, 6], [7, 8, None]), "autotune", "random")
    assert missed["p"] == pytest.approx(2 / 20) and math.isinf(missed["mine"][2])
    assert judge.searches_apart(result([4], [6, 7]), "autotune", "random") is None
    untimed = result([4, 4, 5], [6, 7, 8])
    del untimed["speed"]["random #1"]  # its seconds per step not timed: no test, not a miss
    assert judge.searches_apart(untimed, "autotune", "random") is None
    table = "\n".join(judge.searches_table([result([4, 4, 5], [6, 7, 8])]))
    assert "| t | 2.000, 2.000, 2.500 | 3.000, 3.500, 4.000 | 0.10 |" in table


def test_race_combine_writes_one_report_over_earlier_runs(tmp_path):
    race = bench_module("race")
    rows = [
        {
            "contender": "default",
            "label": "default",
            "overrides": [],
            "interval": None,
            "summaries": [{"steps_to_target": 40, "samples_to_target": 1280}],
        }
    ]
    for task in ("a", "b"):
        result = {
            "task": task,
            "command": "-",
            "rows": rows,
            "notes": [],
            "speed": {"default": {"seconds_per_step": 0.5}},
        }
        (tmp_path / task).mkdir()
        (tmp_path / task / "race.json").write_text(
            json.dumps({"frozen": None, "seeds": [10], "results": [result]})
        )
    race.main(
        ["--out", str(tmp_path / "all"), "--combine", str(tmp_path / "a"), str(tmp_path / "b")]
    )
    text = (tmp_path / "all" / "race.md").read_text()
    assert "| a | 20.000 (40; 1,280) |" in text and "| b | 20.000 (40; 1,280) |" in text
    assert len(json.loads((tmp_path / "all" / "race.json").read_text())["results"]) == 2
    # the same task raced again with another contender (autotune_steps): one task, one row more
    steps_row = {**rows[0], "contender": "autotune_steps", "label": "autotune_steps #0"}
    again = {
        "task": "a",
        "command": "-",
        "rows": [*rows, steps_row],
        "notes": [],
        "speed": {
            "default": {"seconds_per_step": 9.0},
            "autotune_steps #0": {"seconds_per_step": 0.25},
        },
    }
    (tmp_path / "a2").mkdir()
    (tmp_path / "a2" / "race.json").write_text(
        json.dumps({"frozen": None, "seeds": [10], "results": [again]})
    )
    race.main(
        ["--out", str(tmp_path / "all2"), "--combine", str(tmp_path / "a"), str(tmp_path / "a2")]
    )
    merged = json.loads((tmp_path / "all2" / "race.json").read_text())["results"]
    assert len(merged) == 1 and [r["contender"] for r in merged[0]["rows"]] == [
        "default",
        "autotune_steps",
    ]
    assert merged[0]["speed"]["default"] == {"seconds_per_step": 0.5}  # the first window's
    assert merged[0]["notes"][-1].startswith("autotune_steps: from ")


def test_race_remeasure_of_a_combined_task_times_every_recipe_in_one_window(tmp_path, monkeypatch):
    """--remeasure of a --combine folder: each recipe's seconds per step from the new window,
    and the note that a contender came timed in another window is replaced by one saying
    all were timed again."""
    race = bench_module("race")
    rows = [
        {
            "contender": c,
            "label": c,
            "overrides": o,
            "interval": None,
            "summaries": [{"steps_to_target": 40, "samples_to_target": 1280}],
        }
        for c, o in (("default", []), ("random", ["optimizer.lr=0.1"]))
    ]
    combined = {
        "task": "digits",
        "command": "-",
        "rows": rows,
        "notes": [f"random: from elsewhere, {race.OTHER_WINDOW} (its steps compare as they are)"],
        "speed": {"default": {"seconds_per_step": 0.5}, "random": {"window": "elsewhere"}},
    }
    (tmp_path / "comb").mkdir()
    (tmp_path / "comb" / "race.json").write_text(
        json.dumps({"frozen": None, "seeds": [10], "results": [combined]})
    )
    timed_together = []

    def measure(command, recipes, *args, **kwargs):
        timed_together.append(recipes)
        return {label: {"seconds_per_step": 0.1 * (i + 1)} for i, label in enumerate(recipes)}

    monkeypatch.setattr(race.race_speed, "measure", measure)
    race.main(["--out", str(tmp_path / "again"), "--remeasure", str(tmp_path / "comb")])
    result = json.loads((tmp_path / "again" / "race.json").read_text())["results"][0]
    assert timed_together == [{"default": [], "random": ["optimizer.lr=0.1"]}]  # one window
    assert result["speed"] == {
        "default": {"seconds_per_step": 0.1},
        "random": {"seconds_per_step": 0.2},
    }
    assert not any(race.OTHER_WINDOW in note for note in result["notes"])
    assert result["notes"][-1].startswith("every recipe timed again in one window")


# -- bench/autotune_workers.py and bench/autotune_budget.py (issues 48 and 50) ---------------


def _sweep_result(arm, seed, explore, wall, ran, seconds, steps=40):
    """One sweep's figures as bench/autotune_workers.py keeps them."""
    return {
        "arm": arm,
        "seed": seed,
        "command": ["python", "run.py", "-m", f"autotune.workers={arm[1:]}"],
        "wall_s": wall,
        "explore_s": explore,
        "trials": {"COMPLETE": ran // 2, "PRUNED": ran - ran // 2},
        "devices": [f"cpu (x86_64, {2 // int(arm[1:])} threads)"],
        "pick": {"overrides": [], "seconds": seconds, "source": "x", "steps": steps, "verdict": ""},
    }


def test_autotune_workers_bench_alternates_the_order_and_judges_the_paired_ratio(tmp_path):
    """Issue 48's goals from the pairs: W2/W1 explore time (geometric mean, t interval on the
    log scale) at most 0.65 with no fewer trials, and W2's median pick no slower."""
    workers = bench_module("autotune_workers")
    assert workers.plan([0, 1, 2], ["W1", "W2"]) == [
        (0, "W1"),
        (0, "W2"),
        (1, "W2"),
        (1, "W1"),
        (2, "W1"),
        (2, "W2"),
    ]
    args = workers.parse(["--seeds", "5", "--trials", "4"])
    two = workers.overrides(args, workers.arms(2)["W2"], 5)
    assert "hydra/launcher=joblib" in two and "hydra.launcher.n_jobs=2" in two
    assert {
        "autotune.stages=[study]",
        "autotune.budget_trials=4",
        "autotune.sampler_seed=5",
    } <= set(two)
    assert "experiment=autotune" in two and "data=digits" in two
    conv = workers.overrides(workers.parse(["--task", "digits_conv"]), [], 0)
    assert "model=small_resnet" in conv and "autotune.objective=time_to_target" in conv
    with pytest.raises(SystemExit, match="--task=nope is not a task; choose digits or one of"):
        workers.overrides(workers.parse(["--task", "nope"]), [], 0)
    results = [
        _sweep_result("W1", 0, 100.0, 120.0, 40, 0.30),
        _sweep_result("W2", 0, 50.0, 70.0, 40, 0.20),
        _sweep_result("W2", 1, 60.0, 80.0, 40, 0.25),
        _sweep_result("W1", 1, 100.0, 110.0, 40, 0.20),
        _sweep_result("W1", 2, 100.0, 120.0, 40, 0.40),
        _sweep_result("W2", 2, 70.0, 90.0, 40, 0.50),
    ]
    goals = workers.goals(results, "W1", "W2")
    # (0.5 * 0.6 * 0.7) ** (1/3) = 0.594: met on the estimate, the interval reaches above
    assert goals[0].startswith("- W2 finishes the same study in at most 0.65x W1's explore")
    assert ": met (0.59x [" in goals[0] and "reaches above 0.65" in goals[0]
    assert goals[1].endswith(
        "met (0.250 s against 0.300 s, medians over 3 search(es) each; steps to target 40.0 "
        "against 40.0)"
    )
    assert len(goals) == 2
    text = workers.report(
        {"seeds": [0, 1, 2], "trials": 40, "arms": ["W1", "W2"], "results": results}
    )
    assert (
        "| 1 | W2 W1 | 100.0 / 60.0 | 0.60 | 110.0 / 80.0 | 40 (20 complete, 20 pruned) / 40"
        in text
    )
    assert (
        "- W1: median estimated time to target of its picks 0.300 s over 3 search(es); runs on cpu (x86_64, 2 threads)"
        in text
    )
    assert "- W2: median estimated time to target of its picks 0.250 s" in text
    assert "python run.py -m autotune.workers=2  # W2" in text
    (tmp_path / "seed1-W2").mkdir()  # an earlier sweep's folder: its study would continue
    with pytest.raises(
        SystemExit, match=r"seed1-W2 exists: a sweep there would continue its study"
    ):
        workers.main(["--out", str(tmp_path), "--seeds", "0", "1"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["seed1-W2"]  # nothing ran
    results[1]["trials"] = {"COMPLETE": 20, "PRUNED": 19}  # one trial fewer: not the same study
    results[2]["pick"]["seconds"] = 0.9  # W2: 0.2, 0.9, 0.5
    goals = workers.goals(results, "W1", "W2")
    assert goals[0].endswith("NOT met: W2 ran fewer study trials (seed 0: 39 against 40)")
    assert "NOT met (0.500 s against 0.300 s" in goals[1]
    failed = {k: v for k, v in results[4].items() if k != "pick"}  # W1 on seed 2
    goals = workers.goals([*results[:4], {**failed, "error": "error: x"}, results[5]], "W1", "W2")
    assert "medians over 2 search(es)" in goals[1] and goals[2] == (
        "- not judged: sampler seed(s) 2 (a sweep failed or is missing)"
    )


def test_autotune_workers_remeasure_times_each_pick_once_against_the_command(
    tmp_path, monkeypatch, capsys
):
    """--remeasure: every distinct pick and the command timed in one window (race_speed's
    measure, the command first), time to target = the pick's steps x that window's s/step,
    the arms' medians and the goal judged on them, kept in the JSON."""
    workers = bench_module("autotune_workers")
    train = ["experiment=autotune", "autotune.objective=time_to_target", "data=digits"]
    results = [
        _sweep_result("W1", 0, 100.0, 120.0, 40, 0.30, steps=60),
        _sweep_result("W2", 0, 50.0, 70.0, 40, 0.20, steps=50),
        _sweep_result("W2", 1, 60.0, 80.0, 40, 0.25, steps=90),
        _sweep_result("W1", 1, 100.0, 110.0, 40, 0.20, steps=40),
        {**_sweep_result("W1", 2, 100.0, 120.0, 40, 0.40), "error": "error: x"},
        _sweep_result("W2", 2, 70.0, 90.0, 40, 0.50, steps=10),
    ]
    del results[4]["pick"]  # W1 failed on seed 2: seed 2 is not judged
    for found, pick in zip(results, (["a=1"], ["b=2"], [], ["a=1"], None, ["c=3"]), strict=True):
        arm = found["arm"]
        launcher = ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"] if arm == "W2" else []
        seed = f"autotune.sampler_seed={found['seed']}"
        found["command"] = ["python", "run.py", "-m", *train, seed, *launcher]
        if pick is not None:
            found["pick"]["overrides"] = pick
    data = {"seeds": [0, 1, 2], "trials": 40, "task": "digits", "arms": ["W1", "W2"]}
    (tmp_path / workers.FILE_NAME).write_text(json.dumps({**data, "results": results}))
    calls = []

    def measure(command, recipes, folder, rounds, steps):
        calls.append((command, recipes, rounds, steps))
        per_step = {"command": 0.01, "seed0-W1": 0.005, "seed0-W2": 0.002, "seed2-W2": 0.1}
        return {n: {"seconds_per_step": per_step[n], "speeds": [], "batch": 64, "ratio": None}
                for n in recipes}  # fmt: skip

    monkeypatch.setattr(sys.modules["race_speed"], "measure", measure)
    workers.main(["--remeasure", str(tmp_path), "--rounds", "3", "--steps", "64"])
    # one window, each distinct recipe once, the command (the reference) first
    assert calls == [
        (
            ["data=digits"],
            {"command": [], "seed0-W1": ["a=1"], "seed0-W2": ["b=2"], "seed2-W2": ["c=3"]},
            3,
            64,
        )
    ]
    kept = json.loads((tmp_path / workers.FILE_NAME).read_text())["remeasured"]
    times = {(p["seed"], p["arm"]): (p["recipe"], p["time_s"]) for p in kept["picks"]}
    assert times == {
        (0, "W1"): ("seed0-W1", pytest.approx(60 * 0.005)),
        (0, "W2"): ("seed0-W2", pytest.approx(50 * 0.002)),
        (1, "W2"): ("command", pytest.approx(90 * 0.01)),  # kept the command: the command's
        (1, "W1"): ("seed0-W1", pytest.approx(40 * 0.005)),
        (2, "W2"): ("seed2-W2", pytest.approx(10 * 0.1)),
    }
    # seeds 0 and 1: W1 0.3, 0.2 (median 0.25); W2 0.1, 0.9 (median 0.5)
    assert kept["seeds"] == [0, 1]
    assert kept["medians"] == {"W1": pytest.approx(0.25), "W2": pytest.approx(0.5)}
    assert kept["goal"] == (
        "- W2's pick: median time to target no worse than W1's: NOT met (0.500 s against "
        "0.250 s, +100.000%; medians over 2 search(es) each, paired in one window)"
    )
    text = capsys.readouterr().out
    assert "| 1 | W2 | command | 90.0 | 0.0100 | 1.00x | 0.900 s | 0.250 s |" in text
    assert text.rstrip().endswith(kept["goal"])
    workers.main(["--out", str(tmp_path), "--report"])  # the tables again, the paired ones too
    assert capsys.readouterr().out.rstrip().endswith(kept["goal"])
    picks = [{**p, "time_s": 0.1 if p["arm"] == "W2" else 0.2} for p in kept["picks"]]
    assert (
        sys.modules["autotune_remeasure"]
        .paired_goal(picks, "W1", "W2")["goal"]
        .split(": ")[2]
        .startswith("met (0.100")
    )
    results[2]["command"] = [*results[2]["command"], "model=mlp"]  # another training command
    (tmp_path / workers.FILE_NAME).write_text(json.dumps({**data, "results": results}))
    with pytest.raises(SystemExit, match="the sweeps' commands train 2 different commands"):
        workers.main(["--remeasure", str(tmp_path)])


def test_autotune_sweep_reads_the_study_trials_the_pick_and_the_explore_window(tmp_path):
    """What both bench scripts read back from a sweep: the study's own trials (the baseline
    aside), the pick's estimated time, and the explore stage's window from the journal."""
    import optuna
    from optuna.distributions import FloatDistribution
    from optuna.trial import TrialState, create_trial

    sweep = bench_module("autotune_sweep")
    journal = tmp_path / "optuna.journal"
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(journal))
    )
    study = optuna.create_study(study_name="autotune", storage=storage)
    study.add_trial(create_trial(value=1.0, user_attrs={"tuneup_baseline": True}))
    for value in (0.5, 0.7):
        trial = study.ask({"x": FloatDistribution(0, 1)})
        study.tell(trial, value)
    study.tell(study.ask(), state=TrialState.PRUNED)
    record = {
        "study": {"name": "autotune", "storage": str(journal)},
        "cost": {"name": "time"},
        "explore": [
            {"state": "COMPLETE", "baseline": True},
            {"state": "COMPLETE", "baseline": False},
            {"state": "PRUNED", "baseline": False},
            {"state": "FAIL", "baseline": False},
        ],
        "recipe": {"found": ["optimizer.lr=0.1"]},
        "verdict": "faster",
        "confirmed": [
            {
                "label": "baseline",
                "overrides": [],
                "steps_to_target": [60, 70, 80],
                "estimated_time": {"estimate": 0.4},
                "cost_interval": {"estimate": 0.5},
            },
            {
                "label": "optimizer.lr=0.1",
                "overrides": ["optimizer.lr=0.1"],
                "steps_to_target": [30, None, 20],
                "estimated_time": {"estimate": 0.2},
                "cost_interval": {"estimate": 0.25},
            },
        ],
    }
    counts = sweep.study_trials(record)
    assert counts == {"COMPLETE": 1, "PRUNED": 1, "FAIL": 1} and sweep.ran(counts) == 2
    assert sweep.trials_text(counts) == "2 (1 complete, 1 fail, 1 pruned)"
    assert sweep.pick(record) == {
        "overrides": ["optimizer.lr=0.1"],
        "seconds": 0.2,
        "source": "estimated_time",
        "steps": 25,
        "verdict": "faster",
    }
    kept = {**record, "recipe": {"found": []}}
    kept["confirmed"] = [{**record["confirmed"][0], "estimated_time": None}]
    assert sweep.pick(kept)["seconds"] == 0.5 and sweep.pick(kept)["steps"] == 70
    times = sweep.journal_times(record)
    assert len(times) == 4 and [baseline for *_, baseline in times] == [True, False, False, False]
    own = [t for t in times if not t[2]]
    window = sweep.explore_seconds(times)
    assert window == max(e for _, e, _ in own) - min(s for s, _, _ in own) >= 0
    assert sweep.explore_seconds([(0.0, 5.0, True), (10.0, 12.0, False), (11.0, 20.0, False)]) == 10
    assert sweep.explore_seconds([(0.0, 5.0, True)]) is None


def test_autotune_budget_bench_holds_the_minutes_within_ten_percent_either_way():
    """Issue 50's goal: within 10 % of the budget's minutes, either way, and at least one
    study trial; a study whose trials ran out first says so."""
    budget = bench_module("autotune_budget")
    args = budget.parse(["--minutes", "2", "--trials", "1000"])
    assert budget.overrides(args, 2)[-2:] == [
        "autotune.budget_minutes=2",
        "autotune.budget_trials=1000",
    ]
    assert not any("budget_trials" in o for o in budget.overrides(budget.parse([]), 10))
    assert budget.parse([]).minutes == [2, 10] and budget.parse([]).beside == [0]

    def row(minutes, used_s, ran, beside=0, trials=100):
        return {
            "minutes": minutes,
            "beside": beside,
            "beside_runs": beside,
            "command": ["python", "run.py", "-m", f"autotune.budget_minutes={minutes:g}"],
            "folder": "-",
            "wall_s": used_s + 5,
            "load": [1.0, 4.5],
            "elapsed_s": used_s,
            "trials": {"COMPLETE": ran},
            "budget_trials": trials,
            "stages": ["speed", "study"],
            "found": [],
            "verdict": "not significant",
        }

    assert budget.goal(row(2, 108, 3)) == (True, "1.80 of 2 min, 90%; 3 study trial(s)")
    assert budget.goal(row(2, 107, 3))[0] is False  # 89 %
    assert budget.goal(row(2, 133, 3))[0] is False  # 111 %: over, too
    assert budget.goal(row(2, 120, 0)) == (False, "2.00 of 2 min, 100%; 0 study trial(s)")
    spent = budget.goal(row(10, 113, 100))
    assert spent == (
        False,
        "1.88 of 10 min, 19%; 100 study trial(s); the study's 100 trials spent first",
    )
    failed = {**row(2, 0, 0, beside=2), "error": "error: autotune.budget_minutes=2 is too small"}
    rows = [row(2, 108, 3), failed]
    text = budget.report({"lead": 8, "trials": None, "rows": rows})
    assert (
        "| 2 min | 0 (1.0-4.5) | 1.80 of 2 (wall 113 s) | 3 (3 complete) | `your command kept`: not significant | met ("
        in text
    )
    assert (
        "| 2 min | 2 (1.0-4.5) | - (wall 5 s) | - | failed: error: autotune.budget_minutes=2 is too "
        "small | NOT met (the autotune failed) |" in text
    )
    assert (
        "K runs of `python run.py trainer.max_epochs=60` in a loop, the first started 8 s before"
        in text
    )
    assert text.endswith("at least one study trial: NOT met (2 min beside 2)")


def test_autotune_budget_bench_restarts_the_runs_beside_it_and_ends_them(tmp_path):
    """The runs beside the autotune last the whole budget (one that ends is started again)
    and none outlives it; stand-ins for the training runs, which take minutes."""
    import os
    import sys

    budget = bench_module("autotune_budget")
    pids = tmp_path / "pids"
    sleeper = [
        sys.executable,
        "-c",
        f"import os, sys, time; open({str(pids)!r}, 'a').write(f'{{os.getpid()}}\\n');"
        "time.sleep(0.3 if sys.argv[1].endswith('-0') else 600)",
    ]

    def started():
        return pids.read_text().split() if pids.exists() else []

    with budget.Beside(1, tmp_path, lead=0.1, env=dict(os.environ), command=sleeper) as beside:
        for _ in range(100):  # the first ends at once; the second sleeps
            if len(started()) >= 2:
                break
            beside.stop.wait(0.1)
    assert beside.started == 2 and beside.loads
    for pid in map(int, started()):
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # ended, and reaped
    assert (tmp_path / "beside0-1" / "console.log").is_file()


def test_contention_bench_alternates_the_arms_and_reports_tuneup_over_the_default(
    tmp_path, monkeypatch
):
    """bench/contention.py: pairs in alternating order, the ratio tuneup / default (below 1:
    tuneup's choice was faster), and the runs that chose the short spin counted."""
    contention = bench_module("contention")
    order = []

    def fake(command, run_dir, env):
        arm = "default" if env.get("GOMP_SPINCOUNT") == "300000" else "tuneup"
        order.append(arm)
        return (4.0, None) if arm == "default" else (1.0, "short spin (GOMP_SPINCOUNT=1000): 2.0")

    monkeypatch.setattr(contention, "fit_seconds", fake)
    args = contention.parse(["--pairs", "3", "--out", str(tmp_path)])
    task = next(iter(contention.TASKS))
    row = contention.measure(args, task, 0, "-", tmp_path / "row")
    assert order == ["default", "tuneup", "tuneup", "default", "default", "tuneup"]
    assert row["ratio"][0] == 0.25 and row["short_spin"] == 3
    line = contention.report([row]).splitlines()[-1]
    assert line.endswith("| 0.25x [0.25, 0.25] | 3 of 3 |") and "| nothing (load " in line


def test_race_studies_counts_each_searchs_good_trials_against_its_own_command(tmp_path):
    """bench/race_studies.py: per search, completed trials (not the command's, not a missed
    or pruned one), those under half the command's cost, and the best over the command."""
    studies = bench_module("race_studies")

    def trial(value, state="COMPLETE", baseline=False):
        return {"state": state, "value": value, "baseline": baseline}

    for i, values in enumerate([[3.0, 6.0, 4.0], [1.0, 9.0]]):
        folder = tmp_path / "task" / "task" / f"autotune{i}"
        folder.mkdir(parents=True)
        explore = [trial(10.0, baseline=True), *map(trial, values), trial(None, "PRUNED")]
        (folder / "autotune.json").write_text(json.dumps({"explore": explore}))
    found = studies.study_counts(tmp_path / "task" / "task" / "autotune0" / "autotune.json")
    assert found == {"complete": 3, "under_half": 2, "best": 0.3}
    rows = studies.table(tmp_path, ["task"]).splitlines()
    assert rows[2] == "| task | autotune | 3, 2 | 2, 1; 1.5 | 0.30, 0.10; 0.20 |"
    assert len(rows) == 3  # no random searches in the folder: no row
