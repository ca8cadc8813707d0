"""strategy=fsdp builds the model empty and initialises only each process's shards
(plugins/strategy/materialize.py): ``broadcast`` equal to a one-process build, tied weights
and buffers included; ``reset_parameters`` equal too for a model whose init is its modules'
own, under FSDP and tensor parallelism; ``hf`` with transformers' distribution and shards
that differ from process to process; each then trains. Two gloo processes, forked once for
every case; the checks before start in this process."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.test_model_parallel_checks import problems
from tuneup.plugins.strategy.materialize import choose, materialize, seeded_build
from tuneup.plugins.strategy.parallelize import Settings, parallelize
from tuneup.trainer.empty_init import building_empty, empty_parameters

SEED = 3


class Counted(nn.Module):
    """Standard layers only (initialised by their reset_parameters), a BatchNorm's running
    statistics and a non-persistent buffer made in __init__; the head tied to the embedding."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(16, 8)
        self.norm = nn.BatchNorm1d(8)
        self.up = nn.Linear(8, 12)
        self.down = nn.Linear(12, 8)
        self.head = nn.Linear(8, 16, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("positions", torch.arange(4) * 2, persistent=False)

    def forward(self, tokens):
        x = self.embed(tokens) + self.positions[: tokens.shape[1], None]
        x = self.norm(x.transpose(1, 2)).transpose(1, 2)
        return self.head(x + self.down(torch.relu(self.up(x))))


def gpt():
    from tuneup.zoo.models.gpt import GPT

    return GPT(vocab_size=16, context=4, layers=2, heads=2, width=8)


def hf_gpt2():
    from tests.hf_models import tiny_gpt2

    return tiny_gpt2(use_cache=False)


#: name -> (builder, strategy.init, tensor-parallel plan or None: FSDP over both processes)
CASES = {
    "gpt-broadcast": (gpt, "auto", None),
    "counted-reset": (Counted, "reset_parameters", None),
    "counted-reset-tp": (Counted, "reset_parameters", {"up": "colwise", "down": "rowwise"}),
    "gpt2-hf": (hf_gpt2, "auto", None),
}


def whole(model) -> dict[str, torch.Tensor]:
    from torch.distributed.tensor import DTensor

    state = {**model.state_dict(), "positions": getattr(model, "positions", torch.zeros(()))}
    return {
        k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().clone()
        for k, v in state.items()
    }


def tied(model) -> bool:
    """Whether the output head is still the embedding's matrix (one parameter)."""
    head, embedding = (
        ("head", "embed") if isinstance(model, Counted) else ("lm_head", "transformer.wte")
    )
    return model.get_submodule(head).weight is model.get_submodule(embedding).weight


def one_process(rank: int, store: str, out: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    found = {}
    for name, (build, init, plan) in CASES.items():
        shape = (1, 2) if plan else (2, 1)
        mesh = init_device_mesh("cpu", shape, mesh_dim_names=("data_parallel", "tensor_parallel"))
        torch.manual_seed(100 + rank)  # materialize draws from the run's seed, not from here
        with empty_parameters():
            model = build()
        parallelize(model, mesh, Settings(tp_plan=plan or {}))
        how = materialize(model, "cpu", init, SEED, build=seeded_build(build, SEED))
        first = next(p for p in model.parameters() if p.dim() == 2)
        found[name] = {
            "how": how,
            "whole": whole(model),
            "local": first.to_local().clone(),
            "tied": tied(model),
        }
        tokens = torch.arange(8).reshape(2, 4) % 16
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        losses = []
        for _ in range(2):
            out_ = model(tokens)
            logits = out_.logits if hasattr(out_, "logits") else out_
            loss = logits.float().pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
        found[name]["losses"] = losses
    torch.save(found, f"{out}/{rank}.pt")
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    import torch.distributed as dist
    import torch.multiprocessing as mp

    if dist.is_initialized():  # an earlier in-process run's (tuneup closes it at the next launch):
        dist.destroy_process_group()  # forked children must not inherit a live process group
    folder = tmp_path_factory.mktemp("materialize")
    mp.start_processes(
        one_process, args=(str(folder / "store"), str(folder)), nprocs=2, start_method="fork"
    )
    return [torch.load(folder / f"{r}.pt", weights_only=False) for r in (0, 1)]


def reference(build) -> dict[str, torch.Tensor]:
    torch.manual_seed(SEED)
    return whole(build())


def equal(a: dict, b: dict) -> list[str]:
    assert a.keys() == b.keys()
    return [k for k in a if not torch.equal(a[k], b[k])]


@pytest.mark.parametrize("name", ["gpt-broadcast", "counted-reset", "counted-reset-tp"])
def test_the_initial_weights_and_buffers_equal_a_one_process_build(ranks, name):
    build, _, _ = CASES[name]
    assert ranks[0][name]["how"] == ("broadcast" if name == "gpt-broadcast" else "reset_parameters")
    assert ranks[0][name]["tied"] and ranks[1][name]["tied"]
    assert equal(ranks[0][name]["whole"], reference(build)) == []


def test_reset_parameters_is_not_model_gpts_own_init_so_auto_broadcasts():
    assert choose("auto", gpt()) == "broadcast"
    assert choose("auto", hf_gpt2()) == "hf"
    built = reference(gpt)  # GPT-2's N(0, 0.02), not nn.Linear's uniform(+-1/sqrt(8))
    assert abs(float(built["transformer.h.0.mlp.c_fc.weight"].std()) - 0.02) < 0.005


def test_hf_init_draws_transformers_distribution_on_shards_that_differ(ranks):
    got, built = ranks[0]["gpt2-hf"], reference(hf_gpt2)
    assert got["how"] == "hf" and got["tied"]
    for key, value in got["whole"].items():
        assert value.isfinite().all(), key
        if value.dim() == 2 and value.numel() >= 512:  # transformers' N(0, 0.02)
            assert abs(float(value.std()) - float(built[key].std())) < 0.004, key
        else:  # norms' ones and zeros, biases' zeros, the causal mask: as built
            assert torch.equal(value, built[key]), key
    # drawn whole, then sharded: not each process the same draw (DTensor on CPU has no RNG tracker)
    assert not torch.equal(ranks[0]["gpt2-hf"]["local"], ranks[1]["gpt2-hf"]["local"])


def test_each_initialised_model_trains_the_same_on_both_processes(ranks):
    for name in CASES:
        first, second = ranks[0][name]["losses"], ranks[1][name]["losses"]
        assert first == second and first[1] < first[0], name


def test_the_empty_build_keeps_buffers_and_ties_and_holds_no_parameter_memory():
    with empty_parameters():
        assert building_empty()
        model = Counted()
    assert not building_empty()
    assert all(p.is_meta for p in model.parameters())
    assert torch.equal(model.positions, torch.arange(4) * 2)
    assert model.norm.running_var.eq(1).all() and model.head.weight is model.embed.weight
    assert not nn.Linear(2, 2).weight.is_meta  # only inside


def test_strategy_init_values_are_checked_before_start():
    (found,) = problems("trainer.devices=2", "strategy.init=zeros")
    assert "strategy.init" in found and "zeros" in found and "reset_parameters" in found
    (found,) = problems("trainer.devices=2", "strategy.init=hf")
    assert "strategy.init=hf: gpt (GPT) is not a transformers model" in found


# -- the start-up line says in words what initialised the shards (walk 16, point 2) ------------


@pytest.mark.parametrize(
    ("init", "transformers", "said"),
    [
        ("auto", True, "the Hugging Face model's own initialisation (its _init_weights, module by "
         "module) (strategy.init=auto: a transformers model)"),
        ("hf", True, "the Hugging Face model's own initialisation (its _init_weights, module by "
         "module) (strategy.init=hf)"),
        ("auto", False, "rank 0's whole build of the model, sent to every process "
         "(strategy.init=auto: not a transformers model)"),
        ("reset_parameters", False, "each module's own reset_parameters() "
         "(strategy.init=reset_parameters)"),
    ],
)  # fmt: skip
def test_the_startup_line_says_what_initialised_the_shards_in_words(init, transformers, said):
    from tuneup.plugins.strategy.materialize import reason

    base = type("PreTrainedModel", (nn.Module,), {"__module__": "transformers.modeling_utils"})
    model = type("Tiny", (base if transformers else nn.Module,), {})()
    assert reason(init, model) == said
