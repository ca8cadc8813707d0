"""augment=... and progressive_resize=on: per-sample draws, soft labels, the size schedule, training
batches only; one tiny run shared by the assertions about a run."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

from tests.conftest import compose_config
from tuneup.plugins import augment, progressive_resize
from tuneup.plugins.progressive_resize import size_at
from tuneup.trainer import task as tasks


def test_translate_and_flip_draw_per_sample():
    image = torch.arange(3 * 16 * 16, dtype=torch.float32).view(1, 3, 16, 16)
    batch = image.expand(64, -1, -1, -1).contiguous()  # the same image 64 times
    shifted = augment.translate(batch, 2)
    assert len({tuple(s.flatten().tolist()) for s in shifted}) > 5  # not one crop for the batch
    flipped = augment.flip(batch)
    mirrored = [torch.equal(f, image[0].flip(2)) for f in flipped]
    assert any(mirrored) and not all(mirrored)  # a coin per sample
    assert all(m or torch.equal(f, image[0]) for f, m in zip(flipped, mirrored, strict=True))


@pytest.mark.parametrize("alphas", [(0.4, 0.0), (0.0, 1.0)], ids=["mixup", "cutmix"])
def test_mixing_gives_soft_labels(alphas):
    images = torch.randn(32, 3, 8, 8)
    labels = torch.arange(32) % 10
    mixed, soft = augment.mix(images, labels, 10, *alphas)
    assert soft.shape == (32, 10) and soft.dtype == torch.float32
    assert not torch.equal(mixed, images)
    assert torch.allclose(soft.sum(1), torch.ones(32))
    assert ((soft > 0).sum(1) == 2).float().mean() > 0.5  # pairs of different classes
    loss = tasks.classification_loss(torch.randn(32, 10), soft)  # the loss takes them
    assert loss.isfinite()


def test_validation_batches_are_untouched():
    settings = OmegaConf.create({"augment": {"flip": True, "translate": 2, "mixup_alpha": 0.2}})
    plugin = augment.Plugin(settings)
    plugin.num_classes = 10
    batch = [torch.randn(8, 3, 8, 8), torch.arange(8)]
    plugin.on_fit_start(SimpleNamespace(training=False))
    assert plugin.transform_batch(batch) is None
    plugin.on_fit_start(SimpleNamespace(training=True))
    assert plugin.transform_batch(batch)[1].shape == (8, 10)


def test_size_schedule():
    args = (16, 32, 0.25, 0.75, 8)  # start, end, start_fraction, end_fraction, step
    assert [size_at(p, *args) for p in (0.0, 0.25, 0.5, 0.75, 1.0)] == [16, 16, 24, 32, 32]
    assert progressive_resize.schedule_sizes(100, *args) == [16, 24, 32]
    images = torch.randn(2, 3, 32, 32).contiguous(memory_format=torch.channels_last)
    small = progressive_resize.resize(images, 16)
    assert small.shape[-2:] == (16, 16) and small.is_contiguous(memory_format=torch.channels_last)


@pytest.fixture(scope="module")
def mixup_resize_run(tmp_path_factory):
    import json

    import tuneup

    cfg = compose_config(
        [
            "augment=mixup",
            "progressive_resize=on",
            "progressive_resize.start_size=16",
            "data.image_size=32",  # the ramp 16 -> 24 -> 32
            "memory_format=channels_last",
            "compile=on",
            "compile.backend=eager",
        ]
    )  # dynamo: shapes
    out = tmp_path_factory.mktemp("race") / "run"
    tuneup.run(cfg, run_dir=out)
    return json.loads((out / "summary.json").read_text())


def test_run_follows_the_schedule_and_augments_training_only(mixup_resize_run):
    summary = mixup_resize_run
    assert summary["status"] == "ok"
    steps = summary["steps"]  # 256 samples / 32: 8 steps, ramp 16 -> 32 over the first 3/4
    expected = [(s, size_at(s / steps, 16, 32, 0.0, 0.75, 8)) for s in range(steps)]
    began = [
        (s, size) for i, (s, size) in enumerate(expected) if i == 0 or expected[i - 1][1] != size
    ]
    assert [(e["step"], e["size"]) for e in summary["image_size_schedule"]] == began
    assert summary["plugins"]["augment"]["augmented_batches"] == steps  # no validation batch
    # under compile=on each new size is a new shape: recompiles counted, at most one per size
    resize = summary["plugins"]["progressive_resize"]
    assert resize["sizes"] == [16, 24, 32] and resize["recompile_bound"] == 2
    assert 1 <= summary["recompiles"] == resize["recompiles"] <= resize["recompile_bound"]
    assert 0 <= summary["val"]["acc"] <= 1  # validated at full size on hard labels


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["augment=flip_translate", "augment.translate=40"], "augment.translate=40 is not allowed"),
        (["augment=mixup", "kernels=[cross_entropy]"], "computes the loss from integer labels"),
        (["augment=cutmix", "model=gpt", "data=synthetic_tokens"], "task=next_token"),
        (["progressive_resize=on", "progressive_resize.start_size=20"], "multiple of"),
        (["progressive_resize=on", "model=mlp"], "cannot take 24x24 images"),
    ],
)
def test_bad_settings_are_one_line_check_errors(overrides, message, tmp_path):
    from tuneup.trainer.runner import ConfigError, run

    with pytest.raises(ConfigError) as info:
        run(
            compose_config(overrides, tiny="model=mlp" not in overrides), run_dir=tmp_path
        )  # no width
    assert any(message in line for line in str(info.value).splitlines()), str(info.value)
