"""optimizer=muon|nadamw|schedulefree and scheduler=wsd (docs/optimizers.md): what each trains,
its update or schedule against a hand computation, exact resume, and the one-line refusals."""

from __future__ import annotations

import functools
import math
import shutil

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from tests.conftest import compose_config
from tuneup import TuneupError, hookimpl
from tuneup.plugins import muon
from tuneup.plugins.weight_decay import param_groups
from tuneup.trainer.optim import build_scheduler
from tuneup.trainer.runner import ConfigError, run
from tuneup.trainer.state.checkpoint_read import load
from tuneup.trainer.state.checkpoints import list_checkpoints
from zoo.models.gpt import GPT
from zoo.models.small import MLP

#: 32 samples in batches of 4: 8 optimizer steps, one epoch; a two-hidden-layer MLP so that Muon
#: has hidden matrices. A checkpoint every 3 steps (and at the end): the resumed file is step 3's.
BASE = [
    "model=mlp",
    "model.hidden=[8,8]",
    "data.image_size=8",
    "data.train_samples=32",
    "data.val_samples=8",
    "data.batch_size=4",
    "trainer.max_epochs=1",
    "trainer.enable_progress_bar=false",
    "trainer.log_every_n_steps=1",
    "checkpoint.every_n_steps=3",
    "checkpoint.keep_last=null",
]

CHOICES = {
    "muon": ["optimizer=muon"],
    "nadamw": ["optimizer=nadamw"],
    "schedulefree": [
        "optimizer=schedulefree",
        "scheduler=constant",
        "optimizer.warmup_steps=3",
    ],
    "wsd": [
        "optimizer=adamw",
        "scheduler=wsd",
        "scheduler.warmup_steps=2",
        "scheduler.decay_fraction=0.5",
        "scheduler.decay_shape=cosine",
    ],
}


def checkpoints(run_dir):
    return {load(p)["global_step"]: load(p) for p in list_checkpoints(run_dir / "checkpoints")}


@pytest.mark.parametrize("choice", CHOICES)
def test_trains_and_resumes_bit_exactly(train, tmp_path, choice):
    """Weights change and the loss stays finite; a run resumed from step 3's checkpoint ends
    with bit-for-bit the weights and optimizer state of the uninterrupted run."""
    overrides = [*BASE, *CHOICES[choice]]
    whole, whole_dir = train(*overrides, tiny=False, run_dir=tmp_path / "whole")
    assert whole["status"] == "ok" and whole["steps"] == 8
    assert math.isfinite(whole["train_loss"])
    saved = checkpoints(whole_dir)
    first, last = saved[3]["state_dict"], saved[8]["state_dict"]
    assert all(not torch.equal(first[k], last[k]) for k in first if k.endswith("weight"))

    resumed_dir = tmp_path / "resumed"
    (resumed_dir / "checkpoints").mkdir(parents=True)
    source = [p for p in list_checkpoints(whole_dir / "checkpoints") if load(p)["global_step"] == 3]
    shutil.copy(source[0], resumed_dir / "checkpoints" / source[0].name)
    run(compose_config([*overrides, "resume=auto"], tiny=False), run_dir=resumed_dir)
    got = checkpoints(resumed_dir)[8]
    for name, tensor in last.items():
        assert torch.equal(got["state_dict"][name], tensor), name
    want_state = saved[8]["optimizer_states"][0]["state"]
    assert (
        got["optimizer_states"][0]["param_groups"]
        == saved[8]["optimizer_states"][0]["param_groups"]
    )
    got_state = got["optimizer_states"][0]["state"]
    assert want_state.keys() == got_state.keys()
    for index, entries in want_state.items():
        for key, value in entries.items():
            assert torch.equal(torch.as_tensor(got_state[index][key]), torch.as_tensor(value)), (
                index,
                key,
            )


# --- schedulefree: the weights validated, checkpointed and exported -------------------------


class EvalWeightsSpy:
    """At each validation's end: the weights validated, ``z``, the groups' modes, the logged
    val/loss and the loss of those weights computed here; at the next micro-batch's start (after
    the plugin's ``train()``): the weights trained at."""

    def __init__(self) -> None:
        self.validations: list[dict] = []

    @staticmethod
    def weights(module):
        return [p.detach().clone() for p in module.model.parameters()]

    @hookimpl(trylast=True)
    def on_validation_end(self, trainer, module):
        optimizer = trainer.optimizers[0]
        move = trainer.datamodule.transfer_batch_to_device  # uint8 -> normalised floats
        with torch.no_grad():  # the hand evaluation: the model's forward and loss, by batch
            losses = [
                module.compute(module.on_after_batch_transfer(move(b, module.device, 0), 0))[0]
                for b in trainer.val_dataloaders
            ]
        self.validations.append(
            {
                "weights": self.weights(module),
                "z": [optimizer.state[p]["z"].clone() for p in module.model.parameters()],
                "train_mode": [g["train_mode"] for g in optimizer.param_groups],
                "logged": float(trainer.callback_metrics["val/loss"]),
                "by_hand": float(torch.stack(losses).mean()),
                "step": trainer.global_step,
            }
        )

    @hookimpl(trylast=True)
    def on_train_batch_start(self, module):
        if self.validations and "trained_at" not in self.validations[-1]:
            self.validations[-1]["trained_at"] = self.weights(module)


def test_schedulefree_validates_and_saves_the_eval_weights(train, tmp_path, add_plugin):
    """Validation runs on x (optimizer.eval()), whose train() point is the y the next step trains
    at, and the final checkpoint and the Hugging Face-style export hold x too."""
    spy = add_plugin(EvalWeightsSpy())
    _, run_dir = train(
        *BASE,
        *CHOICES["schedulefree"],
        "target.metric=val/loss",
        "target.check_every_n_steps=4",
        "data.val_samples=8",
        tiny=False,
    )
    middle, final = spy.validations
    assert (middle["step"], final["step"]) == (4, 8)
    beta1 = 0.9
    for seen in (middle, final):
        assert seen["train_mode"] == [False]
        assert seen["by_hand"] == pytest.approx(seen["logged"], rel=1e-6)
    for x, z, y in zip(middle["weights"], middle["z"], middle["trained_at"], strict=True):
        assert torch.equal(x.lerp(z, 1 - beta1), y)  # optimizer.train() of what was validated
        assert not torch.equal(x, y)
    saved = checkpoints(run_dir)[8]
    assert [g["train_mode"] for g in saved["optimizer_states"][0]["param_groups"]] == [False]
    for x, tensor in zip(final["weights"], saved["state_dict"].values(), strict=True):
        assert torch.equal(x, tensor)


# --- muon: which parameters Muon trains ----------------------------------------------------


class UserNet(nn.Module):
    """A user's own module: an embedding, a conv, hidden Linears, a norm, an output head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 8)
        self.conv = nn.Conv2d(1, 2, 3)
        self.body = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))
        self.norm = nn.LayerNorm(8)
        self.scale = nn.Parameter(torch.ones(8, 8))  # a 2-D parameter that is not a Linear's
        self.head = nn.Linear(8, 3)


@functools.cache
def muon_config():
    return compose_config(["optimizer=muon"])


def config(*overrides):
    """optimizer=muon's config with ``overrides`` (dotted keys), composed once."""
    return OmegaConf.merge(muon_config(), OmegaConf.from_dotlist(list(overrides)))


def groups(model, *overrides):
    cfg = config(*overrides)
    optimizer = muon.build(cfg, model, [p for p in model.parameters()])
    names = {id(p): n for n, p in model.named_parameters()}
    split = {True: set(), False: set()}
    for group in optimizer.param_groups:
        split[group["use_muon"]] |= {names[id(p)] for p in group["params"]}
    return split[True], split[False]


@pytest.mark.parametrize(
    ("model", "overrides", "expected"),
    [
        (MLP(64, 10, [32, 16]), [], {"net.1.weight", "net.3.weight"}),
        (GPT(vocab_size=11, context=8, layers=2, heads=2, width=8), [],
         {f"transformer.h.{i}.{m}.weight" for i in range(2)
          for m in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")}),
        (UserNet(), [], {"body.0.weight", "body.2.weight"}),
        (UserNet(), ["optimizer.adamw_params=[body.2.*]"], {"body.0.weight", "head.weight"}),
    ],
    ids=["mlp", "gpt (tied head)", "user module", "user module, adamw_params"],
)  # fmt: skip
def test_muon_trains_exactly_the_hidden_matrices(model, overrides, expected):
    on_muon, on_adamw = groups(model, *overrides)
    assert on_muon == expected
    assert on_adamw == {n for n, _ in model.named_parameters()} - expected
    assert all(p.ndim == 2 for n, p in model.named_parameters() if n in on_muon)


def test_muon_keeps_the_weight_decay_groups():
    """weight_decay=skip_norms_biases's groups reach both parts: biases and norms in AdamW with
    no decay, the output layer with optimizer.adamw_weight_decay, Muon's with its own."""
    model = UserNet()
    cfg = config("optimizer.weight_decay=0.05", "optimizer.adamw_weight_decay=0.02")
    optimizer = muon.build(cfg, model, param_groups(model, list(model.parameters())))
    names = {id(p): n for n, p in model.named_parameters()}
    decay = {
        names[id(p)]: (g["use_muon"], g["weight_decay"])
        for g in optimizer.param_groups
        for p in g["params"]
    }
    assert decay == {
        "body.0.weight": (True, 0.05),
        "body.2.weight": (True, 0.05),
        "embed.weight": (False, 0.02),
        "conv.weight": (False, 0.02),
        "scale": (False, 0.02),
        "head.weight": (False, 0.02),
        "conv.bias": (False, 0.0),
        "body.0.bias": (False, 0.0),
        "body.2.bias": (False, 0.0),
        "norm.weight": (False, 0.0),
        "norm.bias": (False, 0.0),
        "head.bias": (False, 0.0),
    }
    assert muon.counts(optimizer) == {
        "muon_tensors": 2,
        "muon_elements": 2 * 8 * 16,
        "adamw_tensors": 10,
        "adamw_elements": 80 + 18 + 2 + 16 + 8 + 16 + 64 + 24 + 3,
    }


def test_muon_adamw_params_that_match_nothing_is_named():
    with pytest.raises(
        TuneupError, match=r"optimizer.adamw_params=\['fc\.\*'\]: fc\.\* matches no"
    ):
        groups(MLP(64, 10, [8]), "optimizer.adamw_params=[fc.*]")


# --- nadamw: AlgoPerf's update --------------------------------------------------------------


def test_nadamw_steps_equal_algoperfs_update_by_hand():
    """Two steps of optimizer=nadamw against AlgoPerf's NAdamW written out in float64; torch's
    NAdam(decoupled_weight_decay=True) is a different update (docs/optimizers.md)."""
    lr, b1, b2, eps, wd = 0.01, 0.9, 0.99, 1e-8, 0.1
    cfg = OmegaConf.create(
        {
            "optimizer": {
                "name": "nadamw",
                "lr": lr,
                "betas": [b1, b2],
                "eps": eps,
                "weight_decay": wd,
            }
        }
    )
    from tuneup.trainer.optim import build_optimizer

    w = torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64, requires_grad=True)
    torch_nadam = torch.optim.NAdam(
        [w2 := w.detach().clone().requires_grad_()],
        lr=lr,
        betas=(b1, b2),
        eps=eps,
        weight_decay=wd,
        decoupled_weight_decay=True,
    )
    optimizer = build_optimizer(cfg, [w])
    grads = [
        torch.tensor([0.3, -0.2, 0.1], dtype=torch.float64),
        torch.tensor([-0.1, 0.4, 0.2], dtype=torch.float64),
    ]
    hand, m, v = [0.5, -1.0, 2.0], [0.0] * 3, [0.0] * 3
    for t, g in enumerate(grads, start=1):
        w.grad, w2.grad = g.clone(), g.clone()
        optimizer.step()
        torch_nadam.step()
        for i, gi in enumerate(g.tolist()):
            hand[i] *= 1 - lr * wd
            m[i] = b1 * m[i] + (1 - b1) * gi
            v[i] = b2 * v[i] + (1 - b2) * gi * gi
            look_ahead = b1 * m[i] + (1 - b1) * gi
            denom = math.sqrt(v[i]) / math.sqrt(1 - b2**t) + eps
            hand[i] -= lr / (1 - b1**t) * look_ahead / denom
        assert torch.allclose(w.detach(), torch.tensor(hand, dtype=torch.float64), rtol=1e-12)
    assert not torch.allclose(w2.detach(), w.detach(), rtol=1e-6)


# --- wsd: the learning rate at known steps --------------------------------------------------


@pytest.mark.parametrize("shape", ["linear", "cosine", "sqrt"])
def test_wsd_learning_rate_at_known_steps(shape):
    """20 steps, warm-up 4, decay over the last 25% (steps 15-19) to 0.1 x lr."""
    cfg = OmegaConf.create(
        {
            "scheduler": {
                "name": "wsd",
                "warmup_steps": 4,
                "decay_fraction": 0.25,
                "min_lr_ratio": 0.1,
                "decay_shape": shape,
            }
        }
    )
    fall = {
        "linear": lambda p: 1 - p,
        "cosine": lambda p: (1 + math.cos(math.pi * p)) / 2,
        "sqrt": lambda p: 1 - math.sqrt(p),
    }[shape]
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=2.0)
    scheduler = build_scheduler(cfg, optimizer, total_steps=20)
    got = []
    for _ in range(20):
        got.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    want = [2.0 * (s + 1) / 4 for s in range(4)] + [2.0] * 11
    want += [2.0 * (0.1 + 0.9 * fall((s - 15) / 5)) for s in range(15, 20)]
    assert got == pytest.approx(want, rel=1e-12)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.2)  # after the last step: the floor


# --- bad values: one line each --------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["scheduler=wsd", "scheduler.decay_fraction=1.5"],
         "scheduler.decay_fraction=1.5 is not allowed: expected a number >= 0 and <= 1"),
        (["scheduler=wsd", "scheduler.decay_shape=step"],
         "scheduler.decay_shape='step' is not allowed: expected one of 'linear', 'cosine', 'sqrt'"),
        (["optimizer=muon", "strategy=fsdp"],
         "optimizer=muon cannot run under strategy=fsdp: Newton-Schulz orthogonalises each whole"),
        (["optimizer=muon"],  # model=small_resnet: its only nn.Linear is the output layer
         "optimizer=muon found no hidden nn.Linear weight in SmallResNet"),
        (["optimizer=muon", "optimizer.ns_steps=0"],
         "optimizer.ns_steps=0 is not allowed"),
        (["optimizer=schedulefree"],
         "scheduler=cosine cannot be used with optimizer=schedulefree: it needs no schedule"),
        (["optimizer=schedulefree", "scheduler=constant", "scheduler.warmup_steps=5"],
         "scheduler.warmup_steps=5 cannot be used with optimizer=schedulefree: set "
         "optimizer.warmup_steps instead"),
    ],
)  # fmt: skip
def test_a_bad_choice_is_one_line(tmp_path, overrides, expected):
    with pytest.raises(ConfigError) as info:
        run(compose_config(overrides), run_dir=tmp_path)
    line = next(x for x in str(info.value).splitlines() if expected in x)
    assert "\n" not in line
