"""Peak CPU memory of each process at start-up under ``strategy=fsdp``: from the command to
the first training step (the model built, sharded and initialised), before (every process
builds the whole model: ``strategy.init=full``) and now (built empty, each process
materialising its shards: ``broadcast``, the default for a model that is not transformers',
and ``reset_parameters``), on CPU processes (gloo). The issue's goal: the sum over the
processes at most one full copy of the model plus the shards (docs/benchmarks.md).

Each variant is one ``python run.py`` with ``trainer.devices=2``; a callback
(:class:`StartupPeak`) writes each process's peak RSS (``ru_maxrss``) when training starts and
stops the run there. ``ru_maxrss`` missed rank 0's peak in the ``full`` run (1.09 GiB where
its RSS was seen at 1.63 GiB: Linux updates the high-water mark lazily, and FSDP had unmapped
the whole model by then), so the bench also reads every process's RSS from ``/proc`` every
20 ms until training starts, and takes the larger. A run of a tiny model gives what Python,
torch and Lightning hold in each process, which the table takes off.

    python bench/memory_startup.py                  # model=gpt of 304M parameters, 2 processes
    python bench/memory_startup.py --processes 4    # 4 processes
    python bench/memory_startup.py --smoke          # a tiny GPT (the figures come out)
    python bench/memory_startup.py -- strategy.tensor_parallel_size=2   # more run.py overrides
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytorch_lightning as pl

ROOT = Path(__file__).resolve().parents[1]
PYTHON = [sys.executable]

#: Variant -> strategy.init; "runtime": the tiny model, what every process holds anyway.
VARIANTS = {
    "runtime": "full",
    "before (full)": "full",
    "broadcast": "broadcast",
    "reset_parameters": "reset_parameters",
}
#: model=gpt's shape: 24 blocks of width 1024 (GPT-2 medium's), 304M parameters. A small
#: vocabulary: data=synthetic_tokens draws a permutation of it per token (vocabulary^2 int64:
#: 20 GB at GPT-2's 50,304), which would measure the data, not the model.
SHAPES = {
    "full": dict(layers=24, heads=16, width=1024, vocab_size=2048),
    "smoke": dict(layers=2, heads=2, width=64, vocab_size=256),
    "runtime": dict(layers=1, heads=2, width=16, vocab_size=64),
}


class StartupPeak(pl.Callback):
    """Writes this process's peak RSS so far into ``out`` as training starts, and stops."""

    def __init__(self, out: str) -> None:
        self.out = Path(out)

    def on_train_start(self, trainer, pl_module) -> None:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
        params = sum(p.numel() for p in pl_module.parameters())  # a DTensor's: the whole's
        figures = {
            "rank": trainer.global_rank,
            "pid": os.getpid(),
            "peak_rss_bytes": peak,
            "parameters": params,
        }
        (self.out / f"startup-{trainer.global_rank}.json").write_text(json.dumps(figures))
        trainer.should_stop = True  # no step: what is measured is the start


def run_overrides(args, variant: str, run_dir: Path) -> list[str]:
    shape = SHAPES["runtime" if variant == "runtime" else "smoke" if args.smoke else "full"]
    return [
        "model=gpt",
        "data=synthetic_tokens",
        *(f"model.{key}={shape[key]}" for key in ("layers", "heads", "width")),
        f"data.vocab_size={shape['vocab_size']}",
        "data.context=16",
        "data.batch_size=1",
        "data.train_samples=4",
        "data.val_samples=1",
        "trainer.accelerator=cpu",
        f"trainer.devices={args.processes}",
        "trainer.max_steps=1",
        "trainer.max_epochs=1",
        "trainer.enable_progress_bar=false",
        "++trainer.limit_val_batches=0",
        "checkpoint=off",
        "strategy=fsdp",
        f"strategy.init={VARIANTS[variant]}",
        f"+callbacks.startup={{_target_: memory_startup.StartupPeak, out: '{run_dir}'}}",
        f"hydra.run.dir={run_dir}",
        *args.extra,
    ]


def run_one(args, variant: str, workdir: Path) -> dict:
    run_dir = workdir / variant.split()[0]
    run_dir.mkdir(parents=True)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "bench"), os.environ.get("PYTHONPATH", "")]),
    }
    started = time.perf_counter()
    with tempfile.TemporaryFile("w+") as err:
        done = subprocess.Popen(
            [*PYTHON, str(ROOT / "run.py"), *run_overrides(args, variant, run_dir)],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=env,
        )
        sampled = sample_rss(done, run_dir, args.processes)
        err.seek(0)
        stderr = err.read()
    row = {"variant": variant, "seconds": time.perf_counter() - started}
    ranks = [json.loads(p.read_text()) for p in sorted(run_dir.glob("startup-*.json"))]
    if done.returncode != 0 or len(ranks) != args.processes:
        return {**row, "error": stderr.strip().splitlines()[-1:] or [str(done.returncode)]}
    for rank in ranks:  # ru_maxrss can miss a peak whose pages were unmapped since (rank 0's)
        rank["sampled_peak_rss_bytes"] = sampled.get(rank["pid"], 0)
        rank["peak_rss_bytes"] = max(rank["peak_rss_bytes"], rank["sampled_peak_rss_bytes"])
    return {**row, "ranks": ranks}


def sample_rss(process: subprocess.Popen, run_dir: Path, ranks: int, every_s=0.02) -> dict:
    """Each process of ``process``'s tree: its largest RSS (``/proc/PID/status`` VmRSS) seen
    until every rank has written its start-up figures; waits for ``process`` to end."""
    peaks: dict[int, int] = {}
    while process.poll() is None:
        if len(list(run_dir.glob("startup-*.json"))) < ranks:
            for pid in tree(process.pid):
                peaks[pid] = max(peaks.get(pid, 0), rss(pid))
        time.sleep(every_s)
    return peaks


def tree(root: int) -> list[int]:
    """``root`` and its descendants (from /proc: Linux)."""
    parents = {}
    for status in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = status.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(status.parent.name)] = int(fields[1])
    found, frontier = [root], [root]
    while frontier:
        frontier = [pid for pid, parent in parents.items() if parent in frontier]
        found += frontier
    return found


def rss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def gib(n_bytes: float) -> str:
    return f"{n_bytes / 2**30:.2f}"


def table(rows: list[dict]) -> tuple[str, str]:
    """The table, and whether the goal is met for each variant."""
    runtime = next((r for r in rows if r["variant"] == "runtime" and "ranks" in r), None)
    base = [p["peak_rss_bytes"] for p in runtime["ranks"]] if runtime else [0]
    full = next((r for r in rows if r["variant"] == "before (full)" and "ranks" in r), None)
    model = 4 * full["ranks"][0]["parameters"] if full else None  # bytes in fp32
    lines = [
        "| strategy.init | peak RSS per rank (GiB) | sum | sum less the runtime's "
        "| goal met (<= full copy + shards) | seconds |",
        "|---|---:|---:|---:|---|---:|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['variant']} | failed: {r['error'][0]} | | | | |")
            continue
        peaks = [p["peak_rss_bytes"] for p in r["ranks"]]
        extra = sum(peaks) - sum(base)
        met = (
            "-"
            if r["variant"] == "runtime" or model is None
            else ("yes" if extra <= 2 * model else f"no ({gib(extra - 2 * model)} GiB over)")
        )
        lines.append(
            f"| {r['variant']} | {' / '.join(map(gib, peaks))} | {gib(sum(peaks))} "
            f"| {gib(extra)} | {met} | {r['seconds']:.0f} |"
        )
    note = (
        f"model: {model / 4:,.0f} parameters, {gib(model)} GiB in fp32; goal: the sum less "
        f"the runtime's <= {gib(2 * model)} GiB (one full copy + the shards, one more)"
        if model
        else "model size unknown (the full run failed)"
    )
    return "\n".join(lines), note


def parse(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a tiny GPT")
    parser.add_argument("--processes", type=int, default=2, help="trainer.devices (default 2)")
    parser.add_argument(
        "--variants",
        type=lambda s: s.split(","),
        default=list(VARIANTS),
        help=f"of: {', '.join(VARIANTS)}",
    )
    parser.add_argument("--json", type=Path, help="also write the rows to this file")
    parser.add_argument("extra", nargs="*", help="more run.py overrides (after --)")
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse(argv)
    with tempfile.TemporaryDirectory(prefix="bench-memory-startup-") as workdir:
        rows = []
        for variant in args.variants:
            rows.append(run_one(args, variant, Path(workdir)))
            print(f"{variant}: done", file=sys.stderr, flush=True)
    text, note = table(rows)
    print(f"start-up under strategy=fsdp, {args.processes} CPU processes (gloo); {note}\n\n{text}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    if any("error" in r for r in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
