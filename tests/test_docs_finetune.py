"""docs/distributed.md "Fine-tune a pretrained model that does not fit", run as printed: the
tiny Llama script, the data module, the FSDP run on 2 processes (model.path, micro-batch
auto, async checkpoints) stopped by SIGTERM at step 3, its resume on 1 process with the
export, tuneup-consolidate --format hf, and from_pretrained in plain transformers.

The doc's files and commands are taken from its ``<!-- finetune:NAME -->`` blocks, unchanged;
the test adds only the corpus (the user's text), ``tuneup`` run as ``python run.py``, and a
plugin that sends the run's processes SIGTERM after step 3 (what a scheduler does).
"""

from __future__ import annotations

import json
import re
import runpy
import shlex
import sys

import pytest

from tests.conftest import ROOT, run_cli
from tests.plugin_dists import make_distribution
from tuneup.consolidate import main as consolidate

DOC = ROOT / "docs" / "distributed.md"
PREEMPT = """
import os, signal
from tuneup import hookimpl


class Plugin:
    steps = 0

    @hookimpl
    def on_after_backward(self):  # once a step: no out-of-memory error splits the batch
        Plugin.steps += 1
        if Plugin.steps == int(os.environ.get("PREEMPT_AT_STEP", "0")):
            os.kill(os.getpid(), signal.SIGTERM)
"""


def block(name: str) -> str:
    section = DOC.read_text().split("## Fine-tune a pretrained model")[1].split("\n## ")[0]
    match = re.search(rf"<!-- finetune:{re.escape(name)} -->\n```\w+\n(.*?)```", section, re.S)
    assert match, f"docs/distributed.md's fine-tuning section has no finetune:{name} block"
    return match.group(1)


def command(name: str) -> list[str]:
    """The block's ``tuneup ...`` command as ``run.py``'s arguments."""
    words = shlex.split(block(name))
    assert words[0] == "tuneup"
    return words[1:]


@pytest.fixture(scope="module")
def walked(tmp_path_factory):
    """The whole walkthrough in a project directory of its own; (directory, results)."""
    project, site = tmp_path_factory.mktemp("project"), tmp_path_factory.mktemp("site")
    make_distribution(
        site, "preempt-probe", {"preempt_probe": PREEMPT}, {"preempt_probe": "preempt_probe:Plugin"}
    )
    (project / "my_project").mkdir()
    (project / "my_project" / "__init__.py").write_text("")
    for name in ("make_tiny.py", "my_project/data.py", "load.py"):
        (project / name).write_text(block(name))
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(project)
        runpy.run_path("make_tiny.py", run_name="__main__")  # and corpus.txt: 4 steps of 16
    env = {"PYTHONPATH": str(site), "OMP_NUM_THREADS": "1"}
    train = run_cli(*command("train"), cwd=project, tiny=False, env={**env, "PREEMPT_AT_STEP": "3"})
    resume = run_cli(*command("resume"), cwd=project, tiny=False, env=env)
    return project, {"train": train, "resume": resume}


def test_the_tiny_model_is_a_save_pretrained_directory(walked):
    project, _ = walked
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (project / "tiny-llama" / name).is_file()
    assert len((project / "corpus.txt").read_text().split()) == 72 * 64


def test_fsdp_run_starts_from_the_files_and_a_preemption_saves_mid_epoch(walked):
    project, runs = walked
    train = runs["train"]
    out = train.stdout + train.stderr
    assert train.returncode == 75, out[-3000:]
    assert "preempted: received SIGTERM: stopped after step 3 and saved" in out
    log = (project / "outputs" / "ft" / "tuneup.log").read_text()
    assert (
        "strategy=fsdp: the model is built empty on each process and its shards initialised "
        "by the pretrained weights of model.path=tiny-llama"
    ) in log
    summary = json.loads((project / "outputs" / "ft" / "summary.json").read_text())
    assert summary["resumed_from"].endswith("epoch000-step00000003.ckpt")  # mid-epoch (4 steps)
    assert summary["plugins"]["strategy"]["initialised_by"] == "weights"


def test_resume_on_one_process_says_what_the_doc_says_and_exports(walked):
    project, runs = walked
    resume = runs["resume"]
    out = resume.stdout + resume.stderr
    assert resume.returncode == 0, out[-3000:]
    section = DOC.read_text().split("## Fine-tune a pretrained model")[1].split("\n## ")[0]
    promised = re.findall(r"^  - (?:world size|global batch): .*$", section, re.M)
    assert len(promised) == 2
    for line in promised:
        assert line in out
    (said,) = re.findall(r"`(strategy=fsdp with trainer\.devices=1: one process[^`]*)`", section)
    assert said in out  # the devices the command gave, not "auto" (issue 43)
    summary = json.loads((project / "outputs" / "ft" / "summary.json").read_text())
    assert summary["world_size"] == 1 and summary["steps"] == 12
    assert summary["micro_batch_size"] == 16
    assert summary["checkpoints"]["async"] is True
    hf = project / "outputs" / "ft" / "hf"
    assert summary["checkpoints"]["export"] == str(hf)
    for name in (
        "config.json",
        "generation_config.json",
        "model-00001-of-00001.safetensors",
        "model.safetensors.index.json",
    ):
        assert (hf / name).is_file(), name


def forget_my_project() -> None:
    for name in [m for m in sys.modules if m.split(".")[0] == "my_project"]:
        del sys.modules[name]


def test_consolidate_and_from_pretrained_as_printed(walked, monkeypatch, capsys):
    project, _ = walked
    monkeypatch.chdir(project)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the command puts the project's on it
    words = shlex.split(block("consolidate"))
    assert words[0] == "tuneup-consolidate"
    forget_my_project()  # another test's project (tests/own_project.py) may have imported its own
    try:  # from the project's directory, as typed: the run's data code imports from there
        assert consolidate(words[1:]) == 0
    finally:
        forget_my_project()
    out_dir = project / words[-1]
    index = json.loads((out_dir / "model.safetensors.index.json").read_text())
    assert {(out_dir / f).is_file() for f in index["weight_map"].values()} == {True}
    assert (out_dir / "config.json").is_file()
    capsys.readouterr()
    runpy.run_path("load.py", run_name="__main__")
    printed = capsys.readouterr().out.strip()
    promised = re.search(r"`python load.py` prints `(.*?)`", DOC.read_text()).group(1)
    assert printed == promised
