"""Hugging Face ``transformers`` models trained as ``model=custom``: a tiny GPT-2 built from a
config (nothing downloaded), called by its own conventions (trainer/task.py), its key/value
cache switched off under activation checkpointing, its FLOPs counted; and the "Hugging Face
models" section of docs/your_own_model.md, its files and commands run as printed."""

from __future__ import annotations

import shlex
import subprocess

import pytest
import torch

from tests.conftest import compose_config, python
from tests.hf_models import counting, tiny_gpt2
from tests.own_project import blocks, env, final_weights, summary, tuneup_command, write_project
from tuneup.trainer import flops
from tuneup.trainer import task as tasks
from tuneup.trainer.components import Plan
from tuneup.trainer.runner import ConfigError, run

GPT2 = ["model=custom", "model._target_=tests.hf_models.tiny_gpt2", "~model.width"]
#: tuneup's token data: x and its next tokens y
TOKENS = [
    "data=synthetic_tokens",
    "data.vocab_size=32",
    "data.context=16",
    "data.train_samples=64",
    "data.val_samples=32",
    "data.batch_size=16",
]
#: the user's token data: input ids alone, or with labels aligned to them
OWN_TOKENS = ["data=custom", "data._target_=tests.hf_models.token_data", "data.batch_size=16"]


@pytest.fixture(scope="module")
def plain(tmp_path_factory) -> dict:
    """The summary of the run with activation checkpointing off, that both ways must equal."""
    run_dir = tmp_path_factory.mktemp("off") / "run"
    run(compose_config([*GPT2, *TOKENS, "task=next_token"]), run_dir=run_dir)
    return summary(run_dir)


@pytest.mark.parametrize("how", ["blocks", "selective"])
def test_activation_checkpointing_trains_gpt2_as_off_does_with_its_cache_off(
    train, how, plain, tmp_path
):
    checkpointed, _ = train(
        *GPT2,
        *TOKENS,
        "task=next_token",
        f"activation_checkpointing={how}",
        "activation_checkpointing.block_types=[GPT2Block]",
        run_dir=tmp_path / how,
    )
    assert checkpointed["status"] == "ok"  # selective failed mid-training: aten.slice.Tensor ...
    settings = checkpointed["plugins"]["activation_checkpointing"]
    assert settings["checkpointed_blocks"] == 2
    assert settings["use_cache"] == "switched off for training (config.use_cache=False)"
    assert checkpointed["loss_curve"]["loss"] == plain["loss_curve"]["loss"]  # the same training


def test_model_loss_calls_transformers_with_input_ids_and_labels():
    model = tiny_gpt2().eval()
    x = counting(4, seed=3)
    own = model(input_ids=x, labels=x).loss
    assert torch.equal(tasks.returned_loss(tasks.call_model(model, (x, x))), own)
    assert torch.equal(tasks.returned_loss(tasks.call_model(model, [x])), own)  # labels = ids
    assert torch.equal(tasks.returned_loss(tasks.call_model(model, x)), own)
    assert torch.equal(tasks.logits_of(tasks.forward(model, x)), model(input_ids=x).logits)


@pytest.mark.parametrize("kind", ["inputs", "pairs"])
def test_model_loss_trains_gpt2_on_its_own_labels(train, kind):
    summary, _ = train(
        *GPT2,
        *OWN_TOKENS,
        f"data.kind={kind}",
        "task=model_loss",
        "data.train_samples=128",
        "data.val_samples=32",
        "optimizer=adamw",
        "optimizer.lr=0.02",
        "trainer.max_epochs=2",
    )
    assert summary["status"] == "ok"
    curve = summary["loss_curve"]["loss"]
    assert curve[-1] < curve[0] - 1.0  # the counting pattern is learned


def test_model_loss_on_next_token_targets_is_refused(tmp_path):
    with pytest.raises(
        ConfigError,
        match=r"task=model_loss: model tests.hf_models.tiny_gpt2 is "
        r"a transformers causal LM, which shifts its labels by one itself.*Use "
        r"task=next_token",
    ):
        run(compose_config([*GPT2, *TOKENS, "task=model_loss"]), run_dir=tmp_path)


def test_flops_of_a_model_that_cannot_run_on_meta_are_counted_on_a_cpu_copy(train):
    def plan(use_cache):
        return Plan(
            compose_config([*GPT2, *TOKENS, "task=next_token", f"model.use_cache={use_cache}"])
        )

    cached = flops.count_flops(plan(True))  # runs on the meta device
    rng = torch.random.get_rng_state()
    uncached = flops.count_flops(plan(False))  # .item() on a meta tensor: counted on the CPU
    assert uncached[1] is None and cached[0] > 0  # counted, not a note saying why not
    # the same model: the same count, but for how the causal mask is seen (transformers 4 gives
    # the CPU's attention an explicit mask, counted as unmasked: trainer/flops.py)
    assert 0.95 * cached[0] <= uncached[0] <= 1.05 * cached[0]
    assert torch.equal(torch.random.get_rng_state(), rng)  # the run's random stream untouched
    summary, _ = train(*GPT2, *TOKENS, "task=next_token", "model.use_cache=false")
    assert summary["flops_per_sample"] == uncached[0]


def test_selective_checkpointing_of_a_gpt2_with_its_cache_on_runs_backward(make_config):
    from tuneup.plugins.activation_checkpointing import Plugin

    cfg = make_config(
        ["activation_checkpointing=selective", "activation_checkpointing.block_types=[GPT2Block]"]
    )
    model = Plugin(cfg).configure_model(cfg=cfg, model=tiny_gpt2(use_cache=True))
    x = counting(2, seed=0)
    model(input_ids=x, labels=x).loss.backward()  # was: aten.slice.Tensor ... not found in storage
    assert model.config.use_cache is False


# -- docs/your_own_model.md, "Hugging Face models": its project files and commands ------------


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    return write_project(tmp_path_factory.mktemp("hf-project"))


def documented() -> list[list[str]]:
    """The section's commands, each as its words after ``tuneup``."""
    lines = blocks()["hf-commands"].strip().splitlines()
    assert all(line.startswith("tuneup ") for line in lines)
    return [shlex.split(line)[1:] for line in lines]


def test_documented_gpt2_trains_resumes_exactly_and_takes_the_kernels(
    project, monkeypatch, tmp_path
):
    monkeypatch.syspath_prepend(str(project))  # as tuneup run in the project: its code, conf/
    monkeypatch.chdir(project)
    first, resume, levers, _ = documented()

    def tuneup(words, run_dir):
        words = [w for w in words if not w.startswith("hydra.run.dir=")]  # given as run_dir
        run(compose_config(words, tiny=False), run_dir=run_dir)
        return summary(run_dir)

    assert tuneup(first, tmp_path / "cut")["epochs"] == 1
    resumed = tuneup(resume, tmp_path / "cut")
    whole = tuneup(["experiment=gpt2"], tmp_path / "whole")
    assert resumed["status"] == "ok" and resumed["steps"] == whole["steps"] == 32
    expected, got = final_weights(tmp_path / "whole"), final_weights(tmp_path / "cut")
    assert all(torch.equal(got[name], tensor) for name, tensor in expected.items())
    assert tuneup(resume, tmp_path / "cut") == resumed  # once more: complete, left as it was
    assert whole["val"]["acc"] > 0.1  # chance: 1/128
    assert whole["flops_per_sample"] > 0

    fast = tuneup(levers, tmp_path / "levers")
    assert fast["status"] == "ok" and fast["val"]["acc"] > 0.1
    assert fast["plugins"]["kernels"]["swapped"] == "lm_head (Linear 64 -> 128)"
    checkpointing = fast["plugins"]["activation_checkpointing"]
    assert (
        checkpointing["checkpointed_blocks"] == 2 and "switched off" in checkpointing["use_cache"]
    )


def test_documented_gpt2_trains_under_ddp(project):
    *_, ddp = documented()
    run_dir = project / "outputs" / "ddp"
    result = subprocess.run(
        [*python(), tuneup_command(), *ddp, f"hydra.run.dir={run_dir}"],
        cwd=project,
        env=env(project),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    done = summary(run_dir)
    assert done["world_size"] == 2 and done["steps"] == 2 * 256 // (2 * 16)
    assert done["val"]["acc"] > 0.1
