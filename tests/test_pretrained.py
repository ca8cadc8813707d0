"""model=huggingface: a tiny GPT-2 and a tiny Llama built from their configs and saved with
save_pretrained (nothing downloaded), trained from their weights. One process loads them with
from_pretrained; strategy=fsdp builds them empty and each process reads the slices its shards
hold (DCP's Hugging Face reader): in one process (GPT-2, its output layer tied), and on a 2x2
mesh of 4 processes (Llama: FSDP x tensor parallelism). The first step's loss is the one
from_pretrained gives on the same batch; what does not fit is a one-line check error."""

from __future__ import annotations

import csv
import json
import os

import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from tests.conftest import compose_config, run_cli
from tests.hf_models import tiny_gpt2, tiny_llama
from tuneup.trainer import task as tasks
from tuneup.trainer.components import Plan
from tuneup.trainer.runner import ConfigError, run
from tuneup.zoo.models import huggingface

#: One optimizer step of a learning rate too small to change an fp32 weight: the weights after
#: it are those loaded, for the per-shard comparison.
ONE_STEP = [
    "trainer.max_steps=1",
    "optimizer.lr=1e-30",
    "trainer.accelerator=cpu",
    "trainer.enable_progress_bar=false",
    "trainer.log_every_n_steps=1",
    "data.train_samples=32",
    "data.val_samples=16",
    "+trainer.limit_val_batches=0",
]
#: The model's own loss: batches of input ids alone, labels = input ids (transformers shifts them).
OWN_LOSS = [
    "data=custom",
    "data._target_=tests.hf_models.token_data",
    "data.kind=inputs",
    "task=model_loss",
    "data.batch_size=16",
]
TOKENS = ["data=synthetic_tokens", "data.vocab_size=32", "data.context=16"]
#: Llama's tensor-parallel plan (transformers' own base_model_tp_plan): attention heads and the
#: MLP's hidden features split over the tensor-parallel group.
LLAMA_PLAN = (
    "strategy.tp_plan={model.layers.*.self_attn.q_proj: colwise, "
    "model.layers.*.self_attn.k_proj: colwise, model.layers.*.self_attn.v_proj: colwise, "
    "model.layers.*.self_attn.o_proj: rowwise, model.layers.*.mlp.gate_proj: colwise, "
    "model.layers.*.mlp.up_proj: colwise, model.layers.*.mlp.down_proj: rowwise}"
)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """save_pretrained directories: gpt2/ (tied output layer), llama/ (rotary, grouped-query)."""
    root = tmp_path_factory.mktemp("pretrained")
    torch.manual_seed(0)
    for name, build in (("gpt2", tiny_gpt2), ("llama", tiny_llama)):
        build().save_pretrained(root / name)
    return root


def hf(path) -> list[str]:
    return ["model=huggingface", f"model.path={path}"]


def first_loss(run_dir) -> float:
    with open(run_dir / "metrics.csv") as f:
        return float(next(row for row in csv.DictReader(f) if row["train/loss"])["train/loss"])


def first_batch(overrides):
    """The run's first training batch (one process), as the data module deals it."""
    data = Plan(compose_config(overrides, tiny=False)).data
    data.setup("fit")
    return next(iter(data.train_dataloader()))


@pytest.fixture(scope="module")
def gpt2_runs(saved, tmp_path_factory):
    """GPT-2 trained one step on its own loss: one process, then strategy=fsdp in one process
    (whose MASTER_PORT, still listened on, must not reach the later tests' runs)."""
    runs, environment = {}, dict(os.environ)
    for name, extra in (("one", []), ("fsdp", ["strategy=fsdp", "trainer.devices=1"])):
        runs[name] = tmp_path_factory.mktemp(f"gpt2-{name}")
        run(
            compose_config([*hf(saved / "gpt2"), *OWN_LOSS, *ONE_STEP, *extra], tiny=False),
            run_dir=runs[name],
        )
    os.environ.clear()
    os.environ.update(environment)
    return runs


def test_first_loss_is_from_pretrained_s_own_loss_in_one_process_and_from_the_shards(
    saved, gpt2_runs
):
    (x,) = first_batch([*hf(saved / "gpt2"), *OWN_LOSS, *ONE_STEP])
    model = AutoModelForCausalLM.from_pretrained(saved / "gpt2")
    expected = model(input_ids=x, labels=x).loss.item()
    assert first_loss(gpt2_runs["one"]) == pytest.approx(expected, abs=1e-6)
    # built empty, sharded, each shard read from the file (the tied lm_head with the embedding)
    assert first_loss(gpt2_runs["fsdp"]) == pytest.approx(expected, abs=1e-6)
    described = json.loads((gpt2_runs["fsdp"] / "summary.json").read_text())["plugins"]
    assert described["strategy"]["initialised_by"] == "weights"
    assert described["strategy"]["used"] == "fsdp"  # sharded over a mesh of one, not plain


def test_llama_on_a_2x2_mesh_reads_its_shards_and_starts_at_from_pretrained_s_loss(saved, tmp_path):
    """4 processes, FSDP over 2 x tensor parallelism over 2: data-parallel rank 0 (processes 0
    and 1) trains on every other sample of the global batch of 16, from its first, rank 1 on
    the others; the logged loss is the global batch's, averaged over the data-parallel mesh
    dimension only (a tensor-parallel group shares its batch and its loss)."""
    from tuneup.consolidate import consolidate

    args = [*hf(saved / "llama"), *TOKENS, *ONE_STEP]
    result = run_cli(
        f"hydra.run.dir={tmp_path / 'run'}",
        *args,
        "strategy=fsdp",
        "trainer.devices=4",
        "strategy.tensor_parallel_size=2",
        LLAMA_PLAN,
        "data.batch_size=8",
        tiny=False,
        env={"OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    x, y = first_batch([*args, "data.batch_size=16"])
    model = AutoModelForCausalLM.from_pretrained(saved / "llama")
    shards = [
        tasks.next_token_loss(model(input_ids=x[r::2]).logits, y[r::2]).item() for r in (0, 1)
    ]
    expected = tasks.next_token_loss(model(input_ids=x).logits, y).item()
    assert expected == pytest.approx(sum(shards) / 2, abs=1e-6)  # equal shards: the mean
    assert abs(shards[0] - expected) > 1e-4  # rank 0's own would not do
    assert first_loss(tmp_path / "run") == pytest.approx(expected, abs=1e-6)
    # every process's shards hold their slices: gathered, the checkpoint's tensors exactly
    stored = load_file(saved / "llama" / "model.safetensors")
    (checkpoint,) = (tmp_path / "run" / "checkpoints").glob("*.ckpt")
    trained = consolidate(checkpoint, tmp_path / "weights.pt")
    assert trained.keys() >= stored.keys()
    assert all(torch.equal(trained[key], value) for key, value in stored.items())


# -- what does not fit: one line each, before anything is built ------------------------------


def problems(path, *extra) -> list[str]:
    return Plan(compose_config([*hf(path), *TOKENS, *extra], tiny=False)).problems


def test_a_missing_directory_or_files_are_one_line_naming_model_path(saved, tmp_path):
    (missing,) = problems(tmp_path / "nowhere")
    assert missing.startswith(
        f"model.path='{tmp_path / 'nowhere'}' is neither a directory nor "
        "a hub model in the local cache: expected a directory written by "
        "save_pretrained"
    )
    (no_config,) = problems(tmp_path)
    assert no_config.startswith(f"model.path='{tmp_path}' has no config.json")
    (tmp_path / "config.json").write_text((saved / "gpt2" / "config.json").read_text())
    (no_weights,) = problems(tmp_path)
    assert no_weights.startswith(f"model.path='{tmp_path}' has no *.safetensors file")
    (auto,) = problems(saved / "gpt2", "model.auto_class=AutoTokenizer")
    assert auto.startswith(
        "model.auto_class='AutoTokenizer' is not allowed: expected a transformers AutoModel class"
    )
    (architecture,) = problems(saved / "gpt2", "model.auto_class=AutoModelForSpeechSeq2Seq")
    assert architecture.startswith(
        f"model.path='{saved / 'gpt2'}': AutoModelForSpeechSeq2Seq "
        "cannot build the model of its config.json: ValueError: "
    )
    with pytest.raises(ConfigError, match=r"model.path is not set: model=huggingface needs"):
        run(compose_config(["model=huggingface", *TOKENS], tiny=False), run_dir=tmp_path / "r")


def test_key_and_shape_mismatches_are_one_line_naming_the_first_keys(saved, tmp_path):
    stored = load_file(saved / "llama" / "model.safetensors")
    (tmp_path / "config.json").write_text((saved / "llama" / "config.json").read_text())
    renamed = {k.replace("mlp.up_proj", "mlp.upper"): v for k, v in stored.items()}
    save_file(renamed, tmp_path / "model.safetensors")
    (keys,) = problems(tmp_path)
    assert keys == (
        f"model.path='{tmp_path}' does not fit LlamaForCausalLM "
        "(AutoModelForCausalLM of its config.json): not in the checkpoint: "
        "model.layers.0.mlp.up_proj.weight, model.layers.1.mlp.up_proj.weight; "
        "not in the model: model.layers.0.mlp.upper.weight, "
        "model.layers.1.mlp.upper.weight"
    )
    stored["lm_head.weight"] = stored["lm_head.weight"][:, :16].contiguous()
    save_file(stored, tmp_path / "model.safetensors")
    (shapes,) = problems(tmp_path)
    assert shapes.endswith(
        "shapes differ: lm_head.weight [32, 16] in the checkpoint, [32, 32] in the model"
    )
    with pytest.raises(ConfigError, match=r"shapes differ: lm_head.weight"):
        run(compose_config([*hf(tmp_path), *TOKENS], tiny=False), run_dir=tmp_path / "r")


def test_a_base_model_checkpoint_loads_into_its_causal_lm_as_from_pretrained_does(saved, tmp_path):
    """Names without the base model's prefix (GPT2Model's ``h.0...``, as the hub's GPT-2 has
    them) and an old causal-mask buffer transformers ignores load as from_pretrained loads them."""
    stored = load_file(saved / "gpt2" / "model.safetensors")
    bare = {k.removeprefix("transformer."): v for k, v in stored.items()}
    bare["h.0.attn.bias"] = torch.ones(1, 1, 16, 16)
    (tmp_path / "config.json").write_text((saved / "gpt2" / "config.json").read_text())
    save_file(bare, tmp_path / "model.safetensors")
    assert problems(tmp_path) == []
    settings = OmegaConf.create(
        {"path": str(tmp_path), "auto_class": "AutoModelForCausalLM", "dtype": "float32"}
    )
    with torch.device("meta"):
        model = huggingface.build(settings)
    model.to_empty(device="cpu").tie_weights()
    huggingface.load_shards(model, tmp_path)
    reference = AutoModelForCausalLM.from_pretrained(saved / "gpt2")
    assert all(torch.equal(model.state_dict()[k], v) for k, v in reference.state_dict().items())


def test_a_hub_name_in_the_local_cache_saved_in_several_files_loads(saved, tmp_path, monkeypatch):
    """``model.path=tiny/llama``: the cached snapshot (huggingface_hub's layout), whose weights
    are in six files and their index; nothing is downloaded."""
    import huggingface_hub

    repo = tmp_path / "models--tiny--llama"
    AutoModelForCausalLM.from_pretrained(saved / "llama").save_pretrained(
        repo / "snapshots" / "abc123", max_shard_size="20KB"
    )
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    assert len(list((repo / "snapshots" / "abc123").glob("*.safetensors"))) > 1
    assert problems("tiny/llama") == []
    assert huggingface.resolve("tiny/llama") == repo / "snapshots" / "abc123"
    settings = OmegaConf.create(
        {"path": "tiny/llama", "auto_class": "AutoModelForCausalLM", "dtype": "float32"}
    )
    with torch.device("meta"):
        model = huggingface.build(settings)
    huggingface.load_shards(model.to_empty(device="cpu"), "tiny/llama")
    reference = AutoModelForCausalLM.from_pretrained(saved / "llama")
    assert all(torch.equal(model.state_dict()[k], v) for k, v in reference.state_dict().items())
    assert torch.equal(model.model.rotary_emb.inv_freq, reference.model.rotary_emb.inv_freq)


def test_data_that_does_not_fit_the_pretrained_model_is_refused_as_for_a_model_of_ones_own(saved):
    """The model's vocabulary against the data's, and its own loss on targets already shifted."""
    (vocab,) = problems(saved / "llama", "data.vocab_size=64")
    assert vocab == (
        "model huggingface and data synthetic_tokens do not fit: the model outputs "
        "32 classes, the data has 64"
    )
    (shifted,) = problems(saved / "llama", "task=model_loss")
    assert shifted.startswith("task=model_loss: model huggingface is a transformers causal LM")
