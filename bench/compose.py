"""What a command costs before training, once torch and Lightning are imported: ``tuneup
data.batch_size=0`` (a config error: the config composed, the checks run) in one process,
with Hydra's mode probe (tuneup/mode_probe.py) and without it, interleaved, CPU seconds each.

    python bench/compose.py --repeats 15

Imports are paid once, first, so the figure is what each command, DDP rank and sweep job pays
on top of them. Printed as the Markdown table of docs/benchmarks.md ("Start-up").
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import sys
import tempfile
import time

import pytorch_lightning  # noqa: F401  (imported before the clock, as in a warm process)
import torch

COMMAND = ["data.batch_size=0"]


def one(with_probe: bool, run_dir: str) -> float:
    """CPU seconds of ``tuneup data.batch_size=0`` in this process."""
    import tuneup.cli as cli
    import tuneup.mode_probe as mode_probe

    sys.argv = ["tuneup", f"hydra.run.dir={run_dir}", *COMMAND]
    skip = mode_probe.without_needless_probe
    if with_probe:
        cli.without_needless_probe = lambda argv: contextlib.nullcontext()
    start = time.process_time()
    try:
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            cli.main()
    except SystemExit as exit:
        assert exit.code == 1, exit.code  # the config error, as meant
    finally:
        cli.without_needless_probe = skip
    return time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as folder:
        os.chdir(folder)  # no ./conf here: the built-in configs alone
        one(True, folder)  # the first command in a process pays for tuneup's own imports
        times = {True: [], False: []}
        for _ in range(args.repeats):
            for with_probe in (True, False):
                times[with_probe].append(one(with_probe, folder))
    probe, once = statistics.median(times[True]), statistics.median(times[False])
    print(f"median of {args.repeats}, interleaved, CPU seconds\n")
    print("| `tuneup data.batch_size=0` after the imports | CPU s |\n|---|---|")
    print(f"| config composed twice (Hydra's mode probe, then the run) | {probe:.3f} |")
    print(f"| composed once (tuneup/mode_probe.py) | {once:.3f} |")
    print(f"| saved per command | {probe - once:.3f} |")


if __name__ == "__main__":
    main()
