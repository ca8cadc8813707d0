"""Two nodes on one machine, given their ranks through the environment as torchrun and Slurm do:
the same weights as as many processes on one node, and a SIGTERM to one node's processes
preempts all of them at the same step, then the run resumes exactly."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import torch

from tests.conftest import ROOT, python
from tests.plugin_dists import make_distribution
from tuneup.trainer.state.preemption import EXIT_CODE

#: No BatchNorm and no momentum: a batch's update does not depend on how it is split.
RUN = [
    "model=mlp",
    "data.train_samples=128",
    "data.val_samples=64",
    "data.batch_size=16",
    "trainer.max_epochs=2",
    "trainer.enable_progress_bar=false",
    "trainer.accelerator=cpu",
    "strategy=ddp",
    "optimizer.momentum=0.0",
    "optimizer.nesterov=false",
    "checkpoint.every_n_steps=1",
]
#: Always-on plugin: on node TERM_NODE, SIGTERM each of its processes at micro-batch TERM_AT.
TERM = """
    import os
    import signal

    from tuneup import hookimpl


    class Plugin:
        seen = 0

        @hookimpl
        def on_after_backward(self):
            self.seen += 1
            if os.environ.get("NODE_RANK") == os.environ.get("TERM_NODE") and self.seen == int(
                os.environ.get("TERM_AT", "0")
            ):
                os.kill(os.getpid(), signal.SIGTERM)
"""


def launch(run_dir: Path, *args: str, site: Path, **environment) -> list[subprocess.Popen]:
    """The run's command on 2 "nodes" of 2 processes each, as a cluster would start it."""
    nodes = []
    for node in range(2):
        env = {
            **os.environ,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(29400 + os.getpid() % 500),
            "NODE_RANK": str(node),
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": str(site),
            **environment,
        }
        command = [
            *python(),
            str(ROOT / "run.py"),
            *RUN,
            "trainer.devices=2",
            "trainer.num_nodes=2",
            f"hydra.run.dir={run_dir}",
            *args,
        ]
        nodes.append(
            subprocess.Popen(
                command,
                cwd=run_dir.parent,
                env=env,
                text=True,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
        )
    return nodes


def finish(nodes: list[subprocess.Popen]) -> list[tuple[int, str]]:
    return [(node.wait(timeout=600), node.communicate()[1]) for node in nodes]


def final_weights(run_dir: Path) -> dict:
    newest = sorted((run_dir / "checkpoints").glob("epoch*.ckpt"))[-1]
    return torch.load(newest, weights_only=True)["state_dict"]


def test_two_nodes_of_two_train_like_one_process_on_their_batch_and_preempt_together(tmp_path):
    """The reference is one process on the global batch (4 x 16): DDP's equality to it is the
    promise (tests/test_ddp.py on one node), and it costs one process instead of four."""
    site = make_distribution(
        tmp_path / "site", "tuneup-term", {"tuneup_term": TERM}, {"term": "tuneup_term:Plugin"}
    )
    one_node = subprocess.run(
        [
            *python(),
            str(ROOT / "run.py"),
            *RUN,
            "strategy=auto",
            "trainer.devices=1",
            "data.batch_size=64",
            f"hydra.run.dir={tmp_path / 'one'}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(site)},
        timeout=600,
    )
    assert one_node.returncode == 0, one_node.stderr[-3000:]

    two = tmp_path / "two"
    results = finish(launch(two, site=site, TERM_NODE="1", TERM_AT="3"))
    assert [code for code, _ in results] == [EXIT_CODE, EXIT_CODE], results[0][1][-3000:]
    assert all("preempted: received" in err for _, err in results)
    saved = sorted(p.name for p in (two / "checkpoints").glob("*.ckpt"))
    assert saved[-1].endswith("step00000003.ckpt")  # every process stopped after step 3
    summary = json.loads((two / "summary.json").read_text())
    assert summary["status"] == "preempted" and summary["world_size"] == 4

    results = finish(launch(two, "resume=auto", site=site))
    assert [code for code, _ in results] == [0, 0], results[0][1][-3000:]
    expected, got = final_weights(tmp_path / "one"), final_weights(two)
    for name, tensor in expected.items():
        torch.testing.assert_close(got[name], tensor, rtol=1e-5, atol=1e-6)
