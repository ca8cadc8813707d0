"""Host-device synchronisations per training step on CUDA, and whose they are.

A short tuneup run (in process, as bench/overhead.py builds it) under
``torch.cuda.set_sync_debug_mode("warn")``, switched on after the warm-up steps (the first
steps measure memory and FLOPs once, and may sync). Every sync warning is counted with the
step it fell in, whether that step writes its logged metrics (Lightning reads the logged
loss there, and tuneup reads its deferred NaN/inf check: one sync each per interval is the
design), and whose code asked for it: the innermost frame of the stack that is tuneup's
(trainer/, plugins/, zoo/, tuneup/) or Lightning's. tuneup's count outside logging steps
must be 0; the exit code is 1 otherwise.

    python bench/syncs.py                          # default model, 60 steps, logging every 20
    python bench/syncs.py model=mlp precision=bf16 # any overrides

Needs a CUDA GPU (bench/gpu.sh runs it as step ``syncs``).
"""

from __future__ import annotations

import argparse
import collections
import logging
import sys
import tempfile
import traceback
import warnings
from pathlib import Path

import pytorch_lightning as pl
import torch

import tuneup
from tuneup.trainer.build import build
from tuneup.trainer.components import Plan
from tuneup.trainer.environment import Environment
from tuneup.trainer.plugin_manager import PluginManager

ROOT = Path(tuneup.__file__).resolve().parent.parent  # the checkout (editable install)
OURS = tuple(str(ROOT / d) for d in ("trainer", "plugins", "zoo", "tuneup"))
SYNC = "synchronizing CUDA operation"


def whose(stack: list[traceback.FrameSummary]) -> str:
    """``tuneup file:line`` or ``lightning file:line`` of the innermost such frame, else torch's."""
    for frame in reversed(stack):
        name = frame.filename
        if name.startswith(OURS):
            return f"tuneup {Path(name).relative_to(ROOT)}:{frame.lineno}"
        if "pytorch_lightning" in name or "lightning_fabric" in name:
            return f"lightning {name.split('site-packages/')[-1]}:{frame.lineno}"
    return "torch"


class SyncCounter(pl.Callback):
    def __init__(self, warmup: int) -> None:
        self.warmup = warmup
        self.step, self.logging, self.on = 0, False, False
        self.found: list[tuple[int, bool, str]] = []  # (step, logging step, whose)

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self.step = trainer.global_step
        self.logging = trainer._logger_connector.should_update_logs
        if not self.on and self.step >= self.warmup:
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("warn")
            self.on = True

    def on_train_end(self, trainer, module):
        torch.cuda.set_sync_debug_mode("default")
        self.on = False

    def note(self, message, category, filename, lineno, file=None, line=None):
        if self.on and SYNC in str(message):
            self.found.append((self.step, self.logging, whose(traceback.extract_stack()[:-1])))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--log-every", type=int, default=20)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench/syncs.py: no CUDA device", file=sys.stderr)
        return 2
    logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
    cfg = tuneup.compose(
        [
            "trainer.accelerator=gpu",
            f"trainer.max_steps={args.steps}",
            "trainer.max_epochs=-1",
            f"trainer.log_every_n_steps={args.log_every}",
            "trainer.enable_progress_bar=false",
            "+trainer.limit_val_batches=0",
            "checkpoint=off",
            *args.overrides,
        ]
    )
    counter = SyncCounter(args.warmup)
    with tempfile.TemporaryDirectory() as run_dir, warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = counter.note
        plugins = PluginManager.from_config(cfg)
        plan = Plan(cfg, plugins)
        problems = plugins.check(cfg, Environment.from_config(cfg), plan) + plan.problems
        assert not problems, problems
        trainer, module, data, _ = build(cfg, plugins, plan, Path(run_dir))
        trainer.callbacks.insert(0, counter)  # its step flags set before any other hook
        trainer.fit(module, datamodule=data)
    steps = args.steps - args.warmup
    table = collections.Counter((who, at_log) for _, at_log, who in counter.found)
    print(
        f"{steps} steps counted ({args.warmup} warm-up), logging every {args.log_every}; "
        f"overrides: {' '.join(args.overrides) or 'none'}\n"
    )
    print("| whose sync | at logging steps | at other steps |")
    print("|---|---|---|")
    for who in sorted({who for who, _ in table}):
        print(f"| {who} | {table[(who, True)]} | {table[(who, False)]} |")
    ours = sum(n for (who, at_log), n in table.items() if who.startswith("tuneup") and not at_log)
    print(f"\ntuneup's syncs outside logging steps: {ours} (must be 0)")
    return 1 if ours else 0


if __name__ == "__main__":
    sys.exit(main())
