"""Models: torchvision-identical ResNets, the GPT decoder, and FLOPs per sample in the summary."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import compose_config
from tuneup.trainer.components import Plan
from tuneup.trainer.flops import flops_per_sample, peak_tflops, throughput
from tuneup.zoo.models import resnet
from tuneup.zoo.models.gpt import GPT

#: torchvision's published parameter counts (1000 classes), from its model docs.
TORCHVISION_PARAMETERS = {"resnet18": 11_689_512, "resnet34": 21_797_672, "resnet50": 25_557_032}


def _bn(name: str, channels: int) -> dict:
    shapes = {f"{name}.{p}": (channels,) for p in ("weight", "bias", "running_mean", "running_var")}
    return {**shapes, f"{name}.num_batches_tracked": ()}


def torchvision_state_shapes(name: str, num_classes: int = 1000) -> dict[str, tuple]:
    """torchvision's ResNet state dict, key -> shape, in its order, from its architecture."""
    bottleneck = name == "resnet50"
    counts = [2, 2, 2, 2] if name == "resnet18" else [3, 4, 6, 3]
    expansion = 4 if bottleneck else 1
    shapes = {"conv1.weight": (64, 3, 7, 7), **_bn("bn1", 64)}
    inplanes = 64
    for stage, (count, planes) in enumerate(zip(counts, (64, 128, 256, 512), strict=True), 1):
        for block in range(count):
            p, stride = f"layer{stage}.{block}.", 2 if stage > 1 and block == 0 else 1
            if bottleneck:
                convs = [(planes, inplanes, 1), (planes, planes, 3), (planes * 4, planes, 1)]
            else:
                convs = [(planes, inplanes, 3), (planes, planes, 3)]
            for i, (out, inp, k) in enumerate(convs, 1):
                shapes[f"{p}conv{i}.weight"] = (out, inp, k, k)
                shapes.update(_bn(f"{p}bn{i}", out))
            if stride != 1 or inplanes != planes * expansion:
                shapes[f"{p}downsample.0.weight"] = (planes * expansion, inplanes, 1, 1)
                shapes.update(_bn(f"{p}downsample.1", planes * expansion))
            inplanes = planes * expansion
    return {**shapes, "fc.weight": (num_classes, 512 * expansion), "fc.bias": (num_classes,)}


@pytest.mark.parametrize("name", sorted(TORCHVISION_PARAMETERS))
def test_resnet_has_torchvision_keys_shapes_and_parameter_count(name):
    with torch.device("meta"):
        model = resnet(name, 1000, (3, 224, 224))
    expected = torchvision_state_shapes(name)
    assert [(k, tuple(v.shape)) for k, v in model.state_dict().items()] == list(expected.items())
    assert sum(p.numel() for p in model.parameters()) == TORCHVISION_PARAMETERS[name]


def test_torchvision_state_dict_loads_strictly_into_resnet50():
    model = resnet("resnet50", 1000, (3, 224, 224))
    state = {
        k: torch.zeros(s, dtype=torch.long if k.endswith("num_batches_tracked") else torch.float)
        for k, s in torchvision_state_shapes("resnet50").items()
    }
    model.load_state_dict(state, strict=True)  # raises on any missing, extra or misshapen key
    assert not model.fc.weight.detach().any()


@pytest.mark.parametrize(
    ("size", "stem", "conv1", "pooled"),
    [(32, "auto", (64, 3, 3, 3), False), (224, "auto", (64, 3, 7, 7), True),
     (32, "imagenet", (64, 3, 7, 7), True)],
)  # fmt: skip
def test_stem_adapts_to_the_image_size(size, stem, conv1, pooled):
    model = resnet("resnet18", 10, (3, size, size), stem=stem)
    assert tuple(model.conv1.weight.shape) == conv1
    assert isinstance(model.maxpool, torch.nn.MaxPool2d) == pooled
    assert model.eval()(torch.randn(1, 3, size, size)).shape == (1, 10)


def test_resnet_trains_on_the_default_32x32_data(train):
    summary, _ = train("model=resnet18", "model.width=4", "data.image_size=16")  # TINY: 8 steps
    assert summary["status"] == "ok" and summary["steps"] == 8
    assert summary["plugins"]["measure"] is not None and summary["flops_per_sample"] > 0


def gpt(**kwargs) -> GPT:
    torch.manual_seed(0)
    return GPT(**{"vocab_size": 50, "context": 16, "layers": 2, "heads": 2, "width": 16, **kwargs})


def test_gpt_gives_next_token_logits_for_every_position():
    model = gpt()
    assert model(torch.randint(50, (3, 16))).shape == (3, 16, 50)
    assert model(torch.randint(50, (3, 7))).shape == (3, 7, 50)  # shorter than the context


def test_gpt_is_causal():
    model = gpt().eval()
    x = torch.randint(50, (1, 16))
    changed = x.clone()
    changed[0, 10:] = (changed[0, 10:] + 1) % 50
    a, b = model(x), model(changed)
    torch.testing.assert_close(a[:, :10], b[:, :10])  # positions before 10 do not see the change
    assert not torch.allclose(a[:, 10:], b[:, 10:])


def test_gpt_head_is_tied_and_blocks_are_named_block():
    model = gpt(layers=3)
    assert model.lm_head.weight is model.transformer.wte.weight
    assert [type(m).__name__ for m in model.modules()].count("Block") == 3
    shared = sum(p.numel() for p in model.parameters())  # the tied matrix counted once
    assert shared == sum(p.numel() for n, p in model.named_parameters() if n != "lm_head.weight")


def test_gpt_learns_synthetic_tokens(train):
    summary, _ = train(
        "model=gpt",
        "data=synthetic_tokens",
        "model.width=32",
        "model.layers=1",
        "data.context=16",
        "optimizer=adamw",
        "optimizer.lr=3e-3",
        "trainer.max_epochs=3",
    )
    assert summary["val"]["acc"] > 10 / 256  # ten times chance; the chain allows 53 %


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["model=gpt"], "model=gpt reads tokens but data=synthetic_images gives images; use "
         "data=python_source or data=synthetic_tokens or data=textfile"),
        (["data=synthetic_tokens"], "model=small_resnet reads images but data=synthetic_tokens"),
        (["model=gpt", "data=synthetic_tokens", "model.heads=3"],
         "model.width=128 is not divisible by model.heads=3"),
        (["model=gpt", "data=synthetic_tokens", "model.context=64"],
         "model.context=64 is shorter than the data's sequences (data.context=128)"),
        (["model=resnet50", "model.stem=big"], "model.stem='big' is not allowed: expected one of"),
    ],
)  # fmt: skip
def test_model_problems_name_the_key_and_the_way_out(overrides, expected):
    assert any(expected in p for p in Plan(compose_config(overrides, tiny=False)).problems)


def test_mlp_flops_per_sample_are_exact():
    """Linear layers: forward 2*in*out; backward 2*in*out for the weights, and as much again for
    the input gradient of every layer but the first (its input needs none)."""
    cfg = compose_config(["model=mlp", "model.hidden=[16]", "data.image_size=4"], tiny=False)
    flops = flops_per_sample(Plan(cfg))
    assert flops == 2 * 48 * 16 * 2 + 2 * 16 * 10 * 3


def test_resnet50_at_224_counts_about_three_forward_passes():
    """Forward: 4.1 GMACs = 8.2 GFLOPs (torchvision's figure); with backward about 3x."""
    cfg = compose_config(
        ["model=resnet50", "data.image_size=224", "data.num_classes=1000"], tiny=False
    )
    assert 23e9 < flops_per_sample(Plan(cfg)) < 25e9


def test_mfu_uses_the_device_peak_or_says_why_not():
    assert peak_tflops("NVIDIA H200") == 989.4 and peak_tflops("NVIDIA A100-SXM4-80GB") == 312
    assert peak_tflops("NVIDIA A10G") is None  # not read as an A10 or an A100
    known = throughput(24e9, 10_000, "NVIDIA H200", devices=2)
    assert known["achieved_tflops"] == pytest.approx(240)
    assert known["mfu"] == pytest.approx(240 / (2 * 989.4))
    unknown = throughput(24e9, 100, "cpu (x86_64, 2 threads)", devices=1)
    assert unknown["mfu"] is None and "no known peak for device 'cpu" in unknown["mfu_note"]


def test_summary_reports_flops_and_achieved_tflops(train):
    summary, _ = train(
        "model=mlp",
        "data.train_samples=256",
        "data.val_samples=64",
        "trainer.max_epochs=1",
        "trainer.enable_progress_bar=false",
        "trainer.accelerator=cpu",
        tiny=False,
    )
    assert summary["flops_per_sample"] == pytest.approx(
        2 * 3 * 32 * 32 * 256 * 2 + 2 * 256 * 128 * 3 + 2 * 128 * 10 * 3
    )
    expected = summary["flops_per_sample"] * summary["samples_per_s"] / 1e12
    assert summary["achieved_tflops"] == pytest.approx(expected)
    assert summary["mfu"] is None and "no known peak" in summary["mfu_note"]
