"""Start-up time of the ``tuneup`` command: to the help text, to a config error, to the first
training step, each a fresh process as a user starts it (median of ``--repeats``).

    python bench/startup.py --repeats 5

The first training step is timed by a tiny always-on plugin written into a temporary
folder (an entry point of group ``tuneup``), which records the wall clock when the first
micro-batch starts; the process's own start is taken just before it is spawned. Printed as
the Markdown table of docs/benchmarks.md ("Start-up").
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

STAMP = """
    import os
    import time

    from tuneup import hookimpl


    class Plugin:
        done = False

        @hookimpl
        def on_train_batch_start(self):
            if not self.done:
                self.done = True
                with open(os.environ["STARTUP_STAMP"], "w") as f:
                    f.write(repr(time.time()))
"""
TINY = [
    "data.train_samples=256",
    "data.val_samples=64",
    "data.batch_size=32",
    "trainer.max_steps=2",
    "trainer.enable_progress_bar=false",
    "checkpoint=off",
]


def tuneup() -> str:
    return str(Path(sys.executable).parent / "tuneup")


def stamp_site(folder: Path) -> Path:
    (folder / "tuneup_startup_stamp.py").write_text(textwrap.dedent(STAMP))
    info = folder / "tuneup_startup_stamp-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: tuneup-startup-stamp\nVersion: 1.0\n"
    )
    (info / "entry_points.txt").write_text(
        "[tuneup]\nstartup_stamp = tuneup_startup_stamp:Plugin\n"
    )
    return folder


def seconds(args: list[str], cwd: Path, env: dict, stamp: Path | None = None) -> float:
    started = time.time()
    subprocess.run([tuneup(), *args], cwd=cwd, env=env, capture_output=True, check=False)
    if stamp is None:
        return time.time() - started
    return float(stamp.read_text()) - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work, stamp = Path(tmp), Path(tmp) / "stamp"
        (work / "site").mkdir()
        env = {
            **os.environ,
            "PYTHONPATH": str(stamp_site(work / "site")),
            "STARTUP_STAMP": str(stamp),
        }
        cases = {
            "`tuneup --help`": (["--help"], None),
            "`tuneup data.batch_size=0` (config error)": (["data.batch_size=0"], None),
            "`tuneup` to the first training step": (
                [*TINY, f"hydra.run.dir={work}/run", "resume=auto"],
                stamp,
            ),
        }
        print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, median of {args.repeats}")
        print("| command | seconds |")
        print("|---|---|")
        for name, (argv, stamp_file) in cases.items():
            times = [seconds(argv, work, env, stamp_file) for _ in range(args.repeats)]
            print(f"| {name} | {statistics.median(times):.2f} |")


if __name__ == "__main__":
    main()
