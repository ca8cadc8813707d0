"""A Hugging Face directory out of tuneup: ``checkpoint.export=hf`` at the end of an FSDP2 run
(every rank writing its part) and ``tuneup-consolidate --format hf`` from a checkpoint, sharded
or a single file (one process). ``from_pretrained`` loads it with the trained model's logits;
the tensors are those ``save_pretrained`` writes (GPT-2's tied ``lm_head.weight`` left out);
a model that is not a transformers one is refused in one line.

One run of a tiny GPT-2 on 2 processes (gloo) serves every assertion about it.
"""

from __future__ import annotations

import json

import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file

from tests.conftest import ROOT, compose_config, run_cli
from tests.hf_models import counting, tiny_gpt2
from tuneup.consolidate import consolidate
from tuneup.consolidate import main as consolidate_main
from tuneup.plugins.checkpoint import Plugin, settings_problems
from tuneup.trainer.components import Plan
from tuneup.trainer.state import sharded
from tuneup.trainer.state.checkpoint_write import atomic_save
from tuneup.trainer.state.checkpoints import list_checkpoints
from tuneup.trainer.state.hf_export import INDEX

GPT2 = [
    "model=custom",
    "model._target_=tests.hf_models.tiny_gpt2",
    "model.use_cache=false",
    "task=next_token",
    "data=synthetic_tokens",
    "data.vocab_size=32",
    "data.context=16",
    "data.train_samples=32",
    "data.val_samples=16",
    "data.batch_size=8",
    "trainer.max_epochs=1",
    "trainer.accelerator=cpu",
    "trainer.enable_progress_bar=false",
    "strategy=fsdp",
    "trainer.devices=2",
]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("fsdp-gpt2")
    result = run_cli(
        f"hydra.run.dir={run_dir}",
        *GPT2,
        "checkpoint.export=hf",
        tiny=False,
        env={"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir


def tensors(directory) -> dict[str, torch.Tensor]:
    """Every tensor of a Hugging Face directory, from the files its index names."""
    weight_map = json.loads((directory / INDEX).read_text())["weight_map"]
    found = {}
    for name in sorted(set(weight_map.values())):
        found.update(load_file(directory / name))
    assert set(found) == set(weight_map)
    return found


def test_an_fsdp_run_exports_what_from_pretrained_loads_with_the_trained_logits(run, tmp_path):
    from transformers import AutoModelForCausalLM

    out = run / "hf"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["checkpoints"]["export"] == str(out)
    files = sorted(p.name for p in out.iterdir())
    assert files == [
        "config.json",
        "generation_config.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        INDEX,
    ]  # a file per rank, each wrote one
    assert not [p.name for p in run.iterdir() if p.name.startswith(".hf")]  # no temporary left

    loaded = AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(loaded).__name__ == "GPT2LMHeadModel"  # not FSDP2's FSDPGPT2LMHeadModel
    trained = tiny_gpt2().eval()  # the trained weights, through the torch format
    newest = list_checkpoints(run / "checkpoints")[0]
    trained.load_state_dict(consolidate(newest, tmp_path / "model.pt"))
    x = counting(4, seed=7)
    with torch.no_grad():
        assert torch.equal(loaded(x).logits, trained(x).logits)
        assert not torch.equal(tiny_gpt2().eval()(x).logits, trained(x).logits)  # it can fail

    tiny_gpt2().save_pretrained(tmp_path / "reference")  # the keys save_pretrained writes
    assert set(tensors(out)) == set(load_file(tmp_path / "reference" / "model.safetensors"))
    assert "lm_head.weight" not in tensors(out)  # tied to transformer.wte.weight


def test_consolidate_format_hf_writes_the_same_from_a_sharded_checkpoint_or_a_file(
    run, tmp_path, capsys
):
    newest = list_checkpoints(run / "checkpoints")[0]
    assert newest.is_dir()  # sharded
    out = tmp_path / "from-shards"
    assert consolidate_main(["--format", "hf", str(newest), str(out)]) == 0
    exported = tensors(run / "hf")
    written = tensors(out)
    assert written.keys() == exported.keys()
    assert all(torch.equal(written[k], exported[k]) for k in exported)
    config = json.loads((out / "config.json").read_text())
    assert config == json.loads((run / "hf" / "config.json").read_text())

    # the same checkpoint as one file, in a run directory of its own (its record beside it)
    copy = tmp_path / "one-file"
    (copy / ".hydra").mkdir(parents=True)
    (copy / ".hydra" / "config.yaml").write_text((run / ".hydra" / "config.yaml").read_text())
    single = copy / "checkpoints" / newest.name
    atomic_save(sharded.full_checkpoint(newest), single)
    assert consolidate_main(["--format", "hf", str(single), str(tmp_path / "from-file")]) == 0
    from_file = tensors(tmp_path / "from-file")
    assert all(torch.equal(from_file[k], exported[k]) for k in exported)

    # OUT is replaced only when it is an earlier export: anything else is kept and refused
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    capsys.readouterr()
    assert consolidate_main(["--format", "hf", str(single), str(tmp_path / "mine")]) == 1
    assert "is not a Hugging Face directory written before" in capsys.readouterr().err
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"
    assert consolidate_main(["--format", "hf", str(newest), str(out)]) == 0  # an export: replaced


def test_a_model_not_from_transformers_is_refused_in_one_line(tmp_path, capsys):
    cfg = compose_config(["checkpoint.export=hf"])  # model=mlp
    (found,) = Plugin(cfg).check(cfg=cfg, plan=Plan(cfg))
    assert found.startswith(
        "checkpoint.export=hf writes a transformers PreTrainedModel; the run's "
        "model is tuneup.zoo.models."
    )
    assert "Allowed: model=custom or model=huggingface" in found
    assert settings_problems(compose_config(["checkpoint.export=onnx"])) == [
        "checkpoint.export='onnx' is not allowed: expected one of 'none', 'hf'"
    ]

    # tuneup-consolidate: the run's model is known from its record, before any tensor is read
    (tmp_path / ".hydra").mkdir()
    OmegaConf.save(cfg, tmp_path / ".hydra" / "config.yaml")
    checkpoint = tmp_path / "checkpoints" / "epoch000-step00000001.ckpt"
    atomic_save({"state_dict": {}}, checkpoint)
    assert consolidate_main(["--format", "hf", str(checkpoint), str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert (
        err.startswith(
            "error: --format hf writes a transformers PreTrainedModel; the run's "
            "model is tuneup.zoo.models."
        )
        and err.count("\n") == 1
    )
    assert not (tmp_path / "out").exists()
