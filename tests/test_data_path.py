"""The data path: uint8 batches made floats on the device, the prefetcher, what the summary says.

The device path runs on the CPU here (the CPU is then the device), so what the model reads
is compared with the path it replaced (data.preprocess=worker) batch by batch; the
prefetcher is switched on on the CPU (data_path.prefetch=true) to check that a batch staged
ahead but never trained is not counted, so that a mid-epoch resume stays exact.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from PIL import Image

import tuneup
from tests.conftest import compose_config, register_in_runs
from tests.test_data import make_image_folder
from tuneup import hookimpl
from tuneup.plugins.data_path import data_advice
from tuneup.trainer.components import Plan
from tuneup.trainer.datamodule import ResumablePrefetchLoader, Staged
from tuneup.trainer.state.checkpoint_read import load
from tuneup.trainer.state.checkpoints import checkpoint_name
from tuneup.zoo.data import check_data
from tuneup.zoo.data.decoders import draft_factor
from tuneup.zoo.data.transforms import (
    TrainCrop,
    decode_on_device,
    decode_with_pillow,
    device_images,
    normalize,
)

#: 8 micro-batches of 8 images 8x8 per epoch; small_resnet of width 4.
IMAGES = [
    "data.image_size=8",
    "data.train_samples=64",
    "data.val_samples=16",
    "data.batch_size=8",
    "model.width=4",
    "trainer.max_epochs=1",
    "trainer.enable_progress_bar=false",
    "checkpoint=off",
]


class BatchSpy:
    """The batches the model read (after the device step and every transform_batch)."""

    def __init__(self) -> None:
        self.batches: list[list[torch.Tensor]] = []

    @hookimpl
    def on_train_batch_start(self, batch):
        self.batches.append([t.detach().clone() for t in batch])


@pytest.fixture
def read_batches(train, add_plugin):
    """``read_batches(*overrides)``: (the batches the model read, the summary) of a run."""
    spy = add_plugin(BatchSpy())

    def _read(*overrides):
        spy.batches = []
        summary, _ = train(*overrides, tiny=False)
        return spy.batches, summary

    return _read


@pytest.fixture(scope="module")
def images_batches(tmp_path_factory):
    """(the batches the model read, the summary) of one run of IMAGES, shared by the tests
    that compare another path's batches with it."""
    spy = BatchSpy()
    run_dir = tmp_path_factory.mktemp("images")
    with pytest.MonkeyPatch.context() as patch:
        register_in_runs(patch, [spy])
        tuneup.run(compose_config(IMAGES, tiny=False), run_dir=run_dir)
    return spy.batches, json.loads((run_dir / "summary.json").read_text())


def assert_same_batches(got, expected, atol=1e-6):
    assert len(got) == len(expected) > 0
    for (x, y), (x0, y0) in zip(got, expected, strict=True):
        assert x.dtype == x0.dtype == torch.float32 and x.shape == x0.shape
        torch.testing.assert_close(x, x0, atol=atol, rtol=0)
        assert torch.equal(y, y0)


# --- the device path gives the model what the worker path gave it -------------------------


def test_synthetic_uint8_batches_become_the_worker_paths_floats(read_batches, images_batches):
    device, summary = images_batches
    worker, _ = read_batches(*IMAGES, "data.preprocess=worker")
    assert_same_batches(device, worker)
    path = summary["data_path"]
    assert path["batches"] == "uint8" and path["device"] == "copy, to_float, normalize"
    loader = Plan(compose_config(IMAGES, tiny=False)).data
    loader.setup()
    pixels, _ = next(iter(loader.train_dataloader()))
    assert pixels.dtype == torch.uint8  # what crosses to the device


def test_image_folder_crops_and_flips_match_the_worker_path(read_batches, tmp_path):
    root = make_image_folder(tmp_path / "images", per_class=(16, 2), sizes=((40, 30), (36, 44)))
    common = [
        "data=imagefolder",
        f"data.root={root}",
        "data.image_size=16",
        "data.batch_size=8",
        "data.min_scale=0.2",
        *IMAGES[4:],
    ]
    device, summary = read_batches(*common)
    worker, _ = read_batches(*common, "data.preprocess=worker")
    assert_same_batches(device, worker)
    path = summary["data_path"]
    assert (
        path["worker"]
        == "decode (pillow, draft), random resized crop 16 (scale 0.2-1.0), flip coin"
    )
    assert path["device"] == "copy, flip, to_float, normalize" and path["batches"] == "uint8"
    assert path["decoded_images"] >= 32 and path["decode_images_per_s_per_worker"] > 0


def test_channels_last_and_half_inputs_compose_with_the_device_step(read_batches):
    batches, _ = read_batches(*IMAGES, "memory_format=channels_last")
    x = batches[0][0]
    assert x.dtype == torch.float32 and x.is_contiguous(memory_format=torch.channels_last)
    half, summary = read_batches(*IMAGES, "precision=bf16-true")
    assert summary["status"] == "ok" and half[0][0].dtype == torch.bfloat16


def test_flips_and_normalisation_on_the_device_are_the_cpu_formulas():
    pixels = torch.arange(2 * 3 * 2 * 4, dtype=torch.uint8).view(2, 3, 2, 4)
    out = device_images(pixels, torch.tensor([True, False]), None, None)
    assert torch.equal(out[0], pixels[0].flip(-1).float() / 255)
    assert torch.equal(out[1], pixels[1].float() / 255)
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    assert torch.equal(device_images(pixels, None, mean, std), normalize(pixels, mean, std))
    every = torch.arange(256, dtype=torch.uint8).view(1, 1, 16, 16).expand(1, 3, 16, 16)
    written_out = (every.float() / 255 - torch.tensor(mean).view(-1, 1, 1)) / torch.tensor(
        std
    ).view(-1, 1, 1)  # the formula of the float path before this one
    torch.testing.assert_close(normalize(every, mean, std), written_out, atol=1e-6, rtol=0)


# --- the prefetcher ----------------------------------------------------------------------


def test_the_loader_counts_batches_handed_out_not_those_staged_ahead():
    data = Plan(compose_config(IMAGES, tiny=False)).data
    data.setup()
    loader = ResumablePrefetchLoader(
        data.train_set, batch_size=8, drop_last=True, stage=Staged, **_order(data)
    )
    batches = iter(loader)
    first = next(batches)
    assert isinstance(first, Staged) and first.take()[0].shape == (8, 3, 8, 8)
    assert loader.state_dict()["position"] == 8  # the second batch is staged, not counted
    next(batches)
    assert loader.state_dict()["position"] == 16


def _order(data):
    from tuneup.trainer.state.data_order import train_loader_kwargs

    return train_loader_kwargs(data.train_set, seed=0)


RESUME = [
    "trainer.max_epochs=2",
    "checkpoint=on",
    "checkpoint.every_n_steps=5",
    "checkpoint.keep_last=null",
    "dataloader=workers",
    "dataloader.num_workers=1",
    "data_path.prefetch=true",
    "trainer.enable_progress_bar=false",
]


@pytest.mark.parametrize(
    "run",
    [
        ["model=mlp", "model.hidden=[16]", *IMAGES[:4]],  # uint8 images made floats per batch
        ["model=gpt", "model.layers=1", "model.width=8", "model.dropout=0.1",  # dropout: RNG
         "data=synthetic_tokens", "data.context=8", "data.train_samples=64",
         "data.val_samples=16", "data.batch_size=8"],
    ],
    ids=["images", "tokens-with-dropout"],
)  # fmt: skip
def test_resume_mid_epoch_is_exact_with_the_prefetcher_on(train, tmp_path, run):
    """16 steps in 2 epochs; resumed from step 5 (mid-epoch, the 6th batch staged but not
    trained), the weights end bit for bit as the uninterrupted run's."""
    summary, first = train(*run, *RESUME, tiny=False, run_dir=tmp_path / "first")
    assert summary["data_path"]["prefetch"] == "one batch ahead"
    resumed = tmp_path / "resumed"
    (resumed / "checkpoints").mkdir(parents=True)
    name = checkpoint_name(0, 5)
    shutil.copy(first / "checkpoints" / name, resumed / "checkpoints" / name)
    train(*run, *RESUME, "resume=auto", tiny=False, run_dir=resumed)
    final = checkpoint_name(1, 16)
    expected = load(first / "checkpoints" / final)["state_dict"]
    got = load(resumed / "checkpoints" / final)["state_dict"]
    for key, value in expected.items():
        assert torch.equal(got[key], value), f"{key} differs from the uninterrupted run"


def test_a_users_float_batches_reach_the_model_unchanged(train, add_plugin, tmp_path):
    spy = add_plugin(BatchSpy())
    train(
        "model=custom",
        "model._target_=tests.test_data_path.Classifier",
        "data=custom",
        "data._target_=tests.test_data_path.float_data",
        "data.batch_size=8",
        "dataloader=workers",
        "dataloader.num_workers=1",
        "data_path.prefetch=true",
        "trainer.max_epochs=1",
        "checkpoint=off",
        "trainer.enable_progress_bar=false",
        tiny=False,
    )
    inputs = float_data()[0].tensors[0]
    assert len(spy.batches) == 4
    for x, _ in spy.batches:  # each a batch of the data set's own rows, as they were
        assert x.dtype == torch.float32
        assert all(any(torch.equal(row, r) for r in inputs) for row in x)


class Classifier(torch.nn.Linear):
    """A user's model for :func:`float_data`: 2 features, 4 classes."""

    def __init__(self) -> None:
        super().__init__(2, 4)


def float_data():
    """A user's data: rows of 2 floats, 4 classes."""
    from torch.utils.data import TensorDataset

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(32, 2, generator=generator)
    y = (x[:, 0] > 0).long() + 2 * (x[:, 1] > 0).long()
    return TensorDataset(x, y), TensorDataset(x[:8], y[:8])


# --- synthetic data on the device ----------------------------------------------------------


def test_on_device_data_cut_on_the_device_are_the_loaders_batches(read_batches, images_batches):
    loaded, _ = images_batches
    resident, summary = read_batches(*IMAGES, "data.on_device=true", "dataloader=workers")
    assert_same_batches(resident, loaded, atol=0)
    path = summary["data_path"]
    assert path["num_workers"] == 0 and path["resident"] is True
    assert path["worker"].startswith("none: generated on the device")


def test_on_device_with_worker_preprocessing_is_a_check_error():
    cfg = compose_config(["data.on_device=true", "data.preprocess=worker"], tiny=False)
    (found,) = check_data(cfg)
    assert found.startswith("data.on_device=true keeps uint8 images on the device")


# --- image folders: normalisation, decoding ----------------------------------------------


def test_normalize_compute_measures_the_mean_and_std_and_records_them(train, tmp_path, caplog):
    root = make_image_folder(tmp_path / "images", per_class=(8, 2))
    summary, _ = train(
        "data=imagefolder",
        f"data.root={root}",
        "data.image_size=16",
        "data.normalize=compute",
        *IMAGES[3:],
        tiny=False,
    )
    path = summary["data_path"]
    assert path["normalize"] == "computed on 16 training images"
    # half the images blue (20, 40, 220), half red (220, 30, 30); greyscale ones in between
    assert path["mean"][2] == pytest.approx((220 + 30) / 2 / 255, abs=0.06)
    assert path["std"][0] > 0.3 and all(s > 0 for s in path["std"])  # red: 20 or 220
    assert "data.normalize=given 'data.mean=" in caplog.text


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["data.mean=[0.5,0.5]"], "data.mean=[0.5, 0.5] is not allowed: expected 3 numbers"),
        (["data.std=[0.2,0,0.2]"], "data.std=[0.2, 0, 0.2] is not allowed: expected 3 numbers, "
                                   "one per RGB channel (each > 0)"),
        (["data.min_scale=0.9", "data.max_scale=0.5"], "data.min_scale=0.9 is above "
                                                       "data.max_scale=0.5"),
        (["data.decoder=nvjpeg", "data.preprocess=worker"], "data.decoder=nvjpeg decodes on the "
                                                            "GPU, but data.preprocess='worker'"),
        (["data.decoder=turbo"], "data.decoder='turbo' is not allowed: expected one of"),
    ],
)  # fmt: skip
def test_bad_image_settings_say_what_to_do(tmp_path, overrides, expected):
    root = make_image_folder(tmp_path / "images")
    cfg = compose_config(["data=imagefolder", f"data.root={root}", *overrides], tiny=False)
    assert any(expected in p for p in check_data(cfg)), check_data(cfg)


def photo(path, size=(400, 300)):
    """A JPEG with detail at every scale (smooth noise, edges), quality 90."""
    rng = np.random.default_rng(0)
    coarse = Image.fromarray(rng.integers(0, 255, (6, 8, 3), dtype=np.uint8))
    pixels = np.asarray(coarse.resize(size, Image.Resampling.BICUBIC), dtype=np.float32)
    pixels[:, size[0] // 2 :] = 255 - pixels[:, size[0] // 2 :]  # a hard edge
    pixels += rng.normal(0, 6, pixels.shape)
    Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(path, quality=90)
    return str(path)


def test_draft_decodes_smaller_where_the_crop_allows_and_looks_the_same(tmp_path):
    path = photo(tmp_path / "photo.jpg")
    assert draft_factor((0, 0, 400, 300), 64) == 4 and draft_factor((0, 0, 100, 90), 64) == 1
    full = TrainCrop(64, scale=(1, 1), ratio=(4 / 3, 4 / 3), flip=False, draft=False)
    draft = TrainCrop(64, scale=(1, 1), ratio=(4 / 3, 4 / 3), flip=False, draft=True)
    a, b = full(path)[0].float(), draft(path)[0].float()
    assert (a - b).abs().mean() < 3  # DCT scaling is a good downsample: a few levels of 255


def test_simplejpeg_decodes_as_pillow_does(tmp_path):
    pytest.importorskip("simplejpeg", reason="the optional jpeg extra: pip install 'tuneup[jpeg]'")
    path = photo(tmp_path / "photo.jpg")
    for draft in (False, True):
        kwargs = {"scale": (0.5, 0.5), "ratio": (1, 1), "flip": False, "draft": draft}
        torch.manual_seed(0)
        pil = TrainCrop(64, decoder="pillow", **kwargs)(path)[0].float()
        torch.manual_seed(0)
        simple = TrainCrop(64, decoder="simplejpeg", **kwargs)(path)[0].float()
        assert (pil - simple).abs().mean() < 2


def test_gpu_decoding_path_crops_as_the_workers_do(tmp_path):
    """decoder=nvjpeg's crop and resize (torch, antialiased) against Pillow's in a worker; the
    decoding itself is stood in for by Pillow here (tests/gpu runs nvJPEG)."""
    path = photo(tmp_path / "photo.jpg")
    boxes = torch.tensor([[10, 20, 310, 250], [0, 0, 400, 300]])
    encoded = [torch.from_numpy(np.fromfile(path, dtype=np.uint8))] * 2
    got = decode_on_device(encoded, boxes, 48, "cpu", decode=decode_with_pillow).float()
    with Image.open(path) as img:
        for out, box in zip(got, boxes.tolist(), strict=True):
            ref = np.array(img.resize((48, 48), Image.Resampling.BILINEAR, box=box))
            assert (out - torch.from_numpy(ref).permute(2, 0, 1).float()).abs().mean() < 2


# --- what the summary says --------------------------------------------------------------


def test_advice_names_the_levers_in_order_when_the_wait_is_above_10_percent():
    path = {"num_workers": 0, "pin_memory": False, "prefetch": "off", "batches": "float32"}
    assert data_advice(0.08, 100.0, path, cpus=16, cuda=True) is None
    advice = data_advice(0.45, 100.0, path, cpus=16, cuda=True)
    assert advice.startswith("data_wait_fraction=0.45: the loop waited for data 45% of its time")
    assert advice.index("(1) load in worker processes: dataloader=workers") < advice.index(
        "(2) preprocess on the device: data.preprocess=device"
    )
    assert "(3) pin the batches" in advice and "(4) overlap the copy" in advice
    slow = {
        "num_workers": 8,
        "pin_memory": True,
        "prefetch": "one batch ahead",
        "batches": "uint8",
        "decode_images_per_s_per_worker": 150.0,
    }
    advice = data_advice(0.5, 1000.0, slow, cpus=8, cuda=True)
    assert (
        "(1) decoding is the bottleneck: 150 images/s per worker x 8 = 1200/s, the model "
        "could take about 2000/s" in advice
    )
    assert "data.decoder=simplejpeg or nvjpeg" in advice


def test_a_slow_run_gets_the_advice_in_its_summary(train):
    summary, _ = train("data_path.prefetch=true")  # asked for, without workers: refused
    assert summary["plugins"]["data_path"] == {"name": "auto", "prefetch": True}
    path = summary["data_path"]
    assert path["prefetch"].startswith("off: batches load in the training process")
    assert ("data_advice" in summary) == (summary["data_wait_fraction"] > 0.10)
    assert path["num_workers"] == 0
