"""A user's own project outside the checkout: the files of docs/your_own_model.md, plus a
LightningModule, a Datasets function and a kill switch that tests add to it."""

from __future__ import annotations

import json
import os
import re
import sys
import textwrap
from pathlib import Path

import torch

from tests.conftest import ROOT

DOC = ROOT / "docs" / "your_own_model.md"

#: A LightningModule around the docs' Net, with its own loss, logging and optimizer.
LIT = """
    import pytorch_lightning as pl
    import torch
    from torch.nn import functional as F

    from my_project.nets import Net


    class LitNet(pl.LightningModule):
        def __init__(self, width=16, lr=0.05):
            super().__init__()
            self.net = Net(width)
            self.lr = lr

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = F.cross_entropy(self(x), y)
            self.log("train_loss", loss)
            return loss

        def validation_step(self, batch, batch_idx):
            x, y = batch
            logits = self(x)
            self.log("val_loss", F.cross_entropy(logits, y))
            self.log("val_acc", (logits.argmax(-1) == y).float().mean())

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


    class LitNoOptimizer(LitNet):  # Lightning's own configure_optimizers: it cannot train
        configure_optimizers = pl.LightningModule.configure_optimizers


    class LitNoForward(LitNet):  # reaches its layers directly: there is no forward to compile
        forward = pl.LightningModule.forward

        def training_step(self, batch, batch_idx):
            x, y = batch
            return F.cross_entropy(self.net(x), y)
"""

#: Data as plain Datasets (no LightningDataModule), and models for the checks.
EXTRA = """
    import torch
    from torch import nn

    from my_project.data import quadrant_images


    def make_datasets(train_samples=256):
        return quadrant_images(train_samples, 16, seed=0), quadrant_images(64, 16, seed=1)


    class Flat(nn.Module):  # no convolution: channels_last cannot apply
        def __init__(self, classes=4):
            super().__init__()
            self.fc = nn.Linear(3 * 16 * 16, classes)

        def forward(self, x):
            return self.fc(x.flatten(1))


    class OwnLoss(nn.Module):  # task=model_loss: called with the whole batch
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3 * 16 * 16, 4)

        def forward(self, x, y):
            return {"loss": nn.functional.cross_entropy(self.fc(x.flatten(1)), y)}
"""

#: Installed as an always-on plugin (a distribution without conf/): SIGKILL the process when
#: micro-batch KILL_AT_MICRO_BATCH has its gradients, like a preempted node that gets no signal.
KILLER = """
    import os
    import signal

    from tuneup import hookimpl

    AT = int(os.environ.get("KILL_AT_MICRO_BATCH", "0"))


    class Plugin:
        seen = 0

        @hookimpl
        def on_after_backward(self):
            self.seen += 1
            if self.seen == AT:
                os.kill(os.getpid(), signal.SIGKILL)
"""


def blocks(doc: Path = DOC) -> dict[str, str]:
    """The doc's ``<!-- project:NAME -->`` code blocks by NAME."""
    found = re.findall(r"<!-- project:(\S+) -->\n```\w+\n(.*?)```", doc.read_text(), re.DOTALL)
    return dict(found)


def write_project(folder: Path) -> Path:
    """The documented project (its files exactly as in the docs) plus the test-only modules."""
    for name, text in blocks().items():
        if "/" in name:
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_text(text)
    (folder / "my_project" / "__init__.py").write_text("")
    (folder / "my_project" / "lit.py").write_text(textwrap.dedent(LIT))
    (folder / "my_project" / "extra.py").write_text(textwrap.dedent(EXTRA))
    site = folder / "site"
    site.mkdir()
    (site / "tuneup_killer.py").write_text(textwrap.dedent(KILLER))
    info = site / "tuneup_killer-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tuneup-killer\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[tuneup]\nkiller = tuneup_killer:Plugin\n")
    return folder


def tuneup_command() -> str:
    """The installed console script of the interpreter running the tests."""
    return str(Path(sys.executable).parent / "tuneup")


def env(project: Path, **extra) -> dict:
    """One thread (the same reduction order in every run) and the kill switch importable."""
    return {
        **os.environ,
        "PYTHONPATH": str(project / "site"),
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
        **extra,
    }


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def final_weights(run_dir: Path) -> dict:
    newest = sorted((run_dir / "checkpoints").glob("epoch*.ckpt"))[-1]
    return torch.load(newest, weights_only=True)["state_dict"]
