"""The data path on a CUDA GPU: uint8 batches copied from pinned memory, made floats on the GPU,
the next batch staged on a side stream, data generated on the GPU, nvJPEG decoding.

Marked ``gpu``: skipped, saying why, where torch sees no CUDA device (tests/conftest.py);
bench/gpu.sh runs them. The CPU counterparts are in tests/test_data_path.py.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from tests.test_data import make_image_folder
from tests.test_data_path import IMAGES, BatchSpy, assert_same_batches, photo
from tuneup.trainer.state.checkpoint_read import load
from tuneup.trainer.state.checkpoints import checkpoint_name
from tuneup.zoo.data.transforms import decode_on_device, decode_with_pillow

GPU = "trainer.accelerator=gpu"
WORKERS = ["dataloader=workers", "dataloader.num_workers=2"]


@pytest.fixture
def read_batches(train, add_plugin):
    spy = add_plugin(BatchSpy())

    def _read(*overrides):
        spy.batches = []
        summary, _ = train(*overrides, tiny=False)
        return [[t.cpu() for t in batch] for batch in spy.batches], spy, summary

    return _read


@pytest.mark.gpu
def test_uint8_batches_are_prefetched_and_normalised_on_the_gpu(read_batches):
    """Pinned uint8 batches, staged one ahead on a side stream, reach the model as the float
    batches the workers made before (the stream wait and record_stream keep them intact)."""
    many = [*IMAGES, "data.train_samples=512", "data.batch_size=64", "data.image_size=64"]
    device, spy, summary = read_batches(*many, *WORKERS, GPU)
    assert spy.batches[0][0].device.type == "cuda"
    path = summary["data_path"]
    assert path["batches"] == "uint8" and path["pin_memory"] is True
    assert path["prefetch"] == "one batch ahead"
    worker, _, _ = read_batches(*many, *WORKERS, GPU, "data.preprocess=worker", "data_path=sync")
    assert_same_batches(device, worker)


@pytest.mark.gpu
def test_a_channels_last_model_gets_channels_last_floats_from_the_device_step(read_batches):
    _, spy, summary = read_batches(
        *IMAGES, *WORKERS, GPU, "memory_format=channels_last", "precision=amp"
    )
    x = spy.batches[0][0]
    assert x.is_cuda and x.dtype == torch.float32
    assert x.is_contiguous(memory_format=torch.channels_last) and summary["status"] == "ok"


@pytest.mark.gpu
def test_on_device_data_never_leave_the_gpu(read_batches):
    _, spy, summary = read_batches(*IMAGES, GPU, "data.on_device=true")
    assert all(t.is_cuda for batch in spy.batches for t in batch)
    path = summary["data_path"]
    assert path["resident"] is True and path["num_workers"] == 0


@pytest.mark.gpu
def test_resume_mid_epoch_is_exact_with_the_gpu_prefetcher(train, tmp_path):
    run = [
        "model=mlp",
        "model.hidden=[32]",
        *IMAGES[:4],
        "trainer.max_epochs=2",
        *WORKERS,
        "checkpoint=on",
        "checkpoint.every_n_steps=5",
        "checkpoint.keep_last=null",
        GPU,
        "trainer.enable_progress_bar=false",
    ]
    summary, first = train(*run, tiny=False, run_dir=tmp_path / "first")
    assert summary["data_path"]["prefetch"] == "one batch ahead"
    resumed = tmp_path / "resumed"
    (resumed / "checkpoints").mkdir(parents=True)
    name = checkpoint_name(0, 5)
    shutil.copy(first / "checkpoints" / name, resumed / "checkpoints" / name)
    train(*run, "resume=auto", tiny=False, run_dir=resumed)
    final = checkpoint_name(1, 16)
    expected = load(first / "checkpoints" / final)["state_dict"]
    got = load(resumed / "checkpoints" / final)["state_dict"]
    for key, value in expected.items():  # one skipped or repeated batch moves them far more
        torch.testing.assert_close(got[key], value, rtol=0, atol=1e-6, msg=key)


@pytest.mark.gpu
def test_nvjpeg_decodes_as_pillow_does(tmp_path):
    pytest.importorskip("torchvision", reason="decoder=nvjpeg needs torchvision (CUDA build)")
    path = photo(tmp_path / "photo.jpg")
    encoded = [torch.from_numpy(np.fromfile(path, dtype=np.uint8))] * 3
    boxes = torch.tensor([[10, 20, 310, 250], [0, 0, 400, 300], [100, 50, 164, 114]])
    got = decode_on_device(encoded, boxes, 48, "cuda").cpu().float()
    reference = decode_on_device(encoded, boxes, 48, "cpu", decode=decode_with_pillow).float()
    assert (got - reference).abs().mean() < 3  # libjpeg and nvJPEG round IDCTs differently


@pytest.mark.gpu
def test_a_run_decodes_its_jpegs_on_the_gpu(train, tmp_path):
    pytest.importorskip("torchvision", reason="decoder=nvjpeg needs torchvision (CUDA build)")
    root = make_image_folder(tmp_path / "images", per_class=(16, 2), sizes=((40, 30), (36, 44)))
    for png in root.rglob("*.PNG"):  # nvJPEG reads JPEG only
        png.unlink()
    summary, _ = train(
        "data=imagefolder",
        f"data.root={root}",
        "data.image_size=16",
        "data.decoder=nvjpeg",
        *IMAGES[3:],
        *WORKERS,
        GPU,
        tiny=False,
    )
    path = summary["data_path"]
    assert summary["status"] == "ok" and path["worker"].startswith("read bytes, crop box")
    assert path["device"].startswith("copy, decode (nvjpeg")
