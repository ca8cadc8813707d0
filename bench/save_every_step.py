"""CPU-seconds of a small run that saves a checkpoint every optimizer step, with the pruning
after each save reading back only files this process has not seen (now) or every kept file
(before 2026-11-27: each prune unpickled all of them with the weights-only unpickler).

    python bench/save_every_step.py                 # 3 runs of 24 steps each way, interleaved
    python bench/save_every_step.py --runs 1 --epochs 1

Each run is ``tuneup.run`` in this process on the tests' tiny settings (small_resnet of width
8, 256 samples of 32, ``checkpoint.every_n_steps=1``, keep_last=3); "read back" clears the
per-process record of what was read (trainer/state/checkpoints.py ``_READ``) before every
scan and records nothing at the save, which is what pruning did before. Prints a Markdown
table (docs/benchmarks.md, "Checkpoint pruning").
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TINY = [
    "data.train_samples=256",
    "data.val_samples=128",
    "data.batch_size=32",
    "model.width=8",
    "trainer.enable_progress_bar=false",
    "trainer.log_every_n_steps=1",
    "checkpoint.every_n_steps=1",
]


def parse(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs of each kind, interleaved")
    parser.add_argument("--epochs", type=int, default=3, help="8 steps an epoch")
    return parser.parse_args(argv)


@contextlib.contextmanager
def reading_back(checkpoints, io_module):
    """What pruning did before: every kept file unpickled at every scan."""
    real_scan, real_remember = checkpoints.scan, io_module.remember_written

    def scan(directory, contents=True):
        checkpoints._READ.clear()
        return real_scan(directory, contents)

    checkpoints.scan, io_module.remember_written = scan, lambda path, checkpoint: None
    try:
        yield
    finally:
        checkpoints.scan, io_module.remember_written = real_scan, real_remember


def main(argv=None) -> None:
    args = parse(argv)
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    logging.disable(logging.CRITICAL)  # the runs' own console output: not what is measured
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            measure(args)
    finally:
        logging.disable(logging.NOTSET)


def measure(args) -> None:
    import tuneup
    from tuneup.trainer.state import checkpoint_io, checkpoints

    cfg = tuneup.compose([*TINY, f"trainer.max_epochs={args.epochs}"])
    seconds = {"reads each new file once (now)": [], "reads every kept file (before)": []}
    with tempfile.TemporaryDirectory() as scratch:
        quiet = contextlib.redirect_stdout(io.StringIO())
        with quiet:
            tuneup.run(cfg, run_dir=Path(scratch) / "warm-up")
        for i in range(args.runs):
            for kind in seconds:
                way = reading_back(checkpoints, checkpoint_io) if "before" in kind else None
                with way or contextlib.nullcontext(), contextlib.redirect_stdout(io.StringIO()):
                    start = time.process_time()
                    tuneup.run(cfg, run_dir=Path(scratch) / f"{i}-{'before' in kind}")
                    seconds[kind].append(time.process_time() - start)
    steps = 8 * args.epochs
    print(
        f"{steps} optimizer steps a run, a checkpoint saved and pruned after each; CPU-s a "
        f"run, median of {args.runs}\n"
    )
    print("| pruning | CPU-s a run |\n|---|---|")
    medians = [sorted(values)[len(values) // 2] for values in seconds.values()]
    for kind, median in zip(seconds, medians, strict=True):
        print(f"| {kind} | {median:.2f} |")
    print(
        f"\nreading every kept file back cost {1000 * (medians[1] - medians[0]) / steps:.0f} "
        "CPU-ms a save"
    )


if __name__ == "__main__":
    main()
