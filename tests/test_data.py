"""Data: image folders and text files generated on the fly, synthetic tokens, the transforms."""

from __future__ import annotations

from collections import Counter
from itertools import pairwise

import pytest
import torch
from PIL import Image

from tests.conftest import compose_config
from tuneup.trainer.components import Plan
from tuneup.zoo.data import check_data
from tuneup.zoo.data.transforms import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    CenterCrop,
    OnWorker,
    TrainCrop,
    random_resized_crop_box,
)

COLOURS = {"blue": (20, 40, 220), "red": (220, 30, 30)}


def make_image_folder(root, per_class=(6, 2), sizes=((40, 30), (24, 36))):
    """root/train/<class>/ and root/val/<class>/ with JPEG and PNG images (greyscale in train)."""
    for split, count in zip(("train", "val"), per_class, strict=True):
        for name, colour in COLOURS.items():
            folder = root / split / name
            folder.mkdir(parents=True)
            for i in range(count):
                img = Image.new("RGB", sizes[i % len(sizes)], colour)
                if i == 1:
                    img.save(folder / f"{i}.PNG")  # extensions in any case
                elif i == 2:
                    img.convert("L").save(folder / f"{i}.jpg")  # one channel: read as RGB
                else:
                    img.save(folder / f"{i}.jpg", quality=90)
    (root / "train" / "red" / "notes.txt").write_text("not an image")
    return root


def image_config(root, *overrides):
    return compose_config(
        [
            "data=imagefolder",
            f"data.root={root}",
            "data.image_size=16",
            "data.batch_size=4",
            *overrides,
        ],
        tiny=False,
    )


def model_batches(data, loader):
    """The loader's batches as the model reads them: after the data module's device step."""
    for batch in loader:
        yield data.transfer_batch_to_device(batch, torch.device("cpu"), 0)


def test_imagefolder_gives_normalised_crops_and_class_labels(tmp_path):
    data = Plan(image_config(make_image_folder(tmp_path))).data
    assert data.num_classes == 2 and data.input_shape == (3, 16, 16)
    data.setup()
    assert len(data.train_set) == 12 and len(data.val_set) == 4  # notes.txt is not an image
    pixels, labels, flips = next(iter(data.train_dataloader()))  # what leaves the workers
    assert pixels.shape == (4, 3, 16, 16) and pixels.dtype == torch.uint8
    assert flips.dtype == torch.bool and labels.dtype == torch.long
    x, y = next(model_batches(data, data.train_dataloader()))
    assert x.shape == (4, 3, 16, 16) and x.dtype == torch.float32 and y.dtype == torch.long
    for image, label in zip(*next(model_batches(data, data.val_dataloader())), strict=True):
        colour = COLOURS[("blue", "red")[label]]  # classes: sorted folder names
        expected = [
            (c / 255 - m) / s for c, m, s in zip(colour, IMAGENET_MEAN, IMAGENET_STD, strict=True)
        ]
        torch.testing.assert_close(image.mean((1, 2)), torch.tensor(expected), atol=0.05, rtol=0)


def test_imagefolder_trains_a_model_decoding_in_workers(tmp_path, train):
    root = make_image_folder(tmp_path / "images")
    summary, _ = train(
        "data=imagefolder",
        f"data.root={root}",
        "data.image_size=16",
        "data.batch_size=4",
        "model.width=4",
        "trainer.max_epochs=1",
        "dataloader=workers",
        "dataloader.num_workers=1",
        tiny=False,
    )
    assert summary["status"] == "ok" and summary["steps"] == 3  # 12 images, batches of 4


def test_train_samples_picks_a_fixed_subset_from_every_class(tmp_path):
    cfg = image_config(make_image_folder(tmp_path, per_class=(20, 2)), "data.train_samples=10")
    first, second = Plan(cfg).data, Plan(cfg).data
    first.setup(), second.setup()
    assert first.train_set.samples == second.train_set.samples and len(first.train_set) == 10
    assert {label for _, label in first.train_set.samples} == {0, 1}


def test_missing_image_folder_exits_1_naming_it(tmp_path, cli):
    root = tmp_path / "nowhere"
    result = cli("data=imagefolder", f"data.root={root}", tiny=False)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert (
        f"data.root='{root}': {root}/train does not exist; expected train/ with one folder of "
        "images per class" in result.stderr
    )


@pytest.mark.parametrize(
    ("layout", "expected"),
    [
        ("no_images", "/train is empty: no class folder in it holds an image file"),
        ("no_val", "/val does not exist"),
    ],
)
def test_empty_or_half_image_folder_is_a_clear_error(tmp_path, layout, expected):
    root = tmp_path / "images"
    if layout == "no_images":
        (root / "train" / "cat").mkdir(parents=True)
        (root / "train" / "cat" / "readme.txt").write_text("no images here")
        (root / "val" / "cat").mkdir(parents=True)
    else:
        (root / "train" / "cat").mkdir(parents=True)
        Image.new("RGB", (8, 8)).save(root / "train" / "cat" / "0.png")
    (found, *_) = check_data(image_config(root))
    assert found.startswith(f"data.root='{root}': ") and expected in found


def test_unset_root_and_path_say_what_to_set():
    assert check_data(compose_config(["data=imagefolder"], tiny=False)) == [
        "data.root is not set: give the folder holding train/ and val/, e.g. data.root=/data/imagenet"
    ]
    assert "data.path is not set" in check_data(compose_config(["data=textfile"], tiny=False))[0]


def test_random_resized_crop_stays_inside_with_the_asked_area_and_aspect():
    torch.manual_seed(0)
    for _ in range(200):
        left, top, right, bottom = random_resized_crop_box(200, 100, (0.25, 0.5), (0.8, 1.25))
        assert 0 <= left < right <= 200 and 0 <= top < bottom <= 100
        w, h = right - left, bottom - top
        assert 0.24 <= w * h / 20_000 <= 0.51 and 0.75 <= w / h <= 1.33


def test_train_crop_flips_half_the_time_and_eval_is_a_centre_crop(tmp_path):
    img = Image.new("RGB", (32, 32), (0, 0, 0))
    img.paste((255, 255, 255), (0, 0, 16, 32))  # white left half
    img.save(tmp_path / "half.png")
    crop = TrainCrop(8, scale=(1.0, 1.0), ratio=(1.0, 1.0))
    torch.manual_seed(0)
    coins = [crop(str(tmp_path / "half.png"))[1] for _ in range(40)]
    assert 5 < sum(coins) < 35  # both orientations occur
    on_worker = OnWorker(crop, mean=(0, 0, 0), std=(1, 1, 1))
    left_white = {bool(on_worker(str(tmp_path / "half.png"))[0, 0, 0] > 0.5) for _ in range(40)}
    assert left_white == {True, False}  # the worker path applies the coin it drew
    wide = Image.new("RGB", (64, 32), (0, 0, 0))
    wide.paste((255, 255, 255), (28, 0, 36, 32))  # a white band in the middle
    wide.save(tmp_path / "wide.png")
    out, flip = CenterCrop(16, crop_fraction=0.5)(str(tmp_path / "wide.png"))
    assert out.shape == (3, 16, 16) and out.dtype == torch.uint8 and flip is False
    assert torch.equal(out, CenterCrop(16, 0.5)(str(tmp_path / "wide.png"))[0])  # deterministic
    assert out[:, :, 8].min() > 230 and out[:, :, 0].max() < 25  # the band, not the border


def test_synthetic_tokens_are_next_token_pairs_and_reproducible():
    cfg = compose_config(
        ["data=synthetic_tokens", "data.context=12", "data.vocab_size=40"], tiny=False
    )
    data = Plan(cfg).data
    assert data.input_shape == (12,) and data.num_classes == 40
    data.setup()
    x, y = data.train_set[:8]
    assert x.shape == y.shape == (8, 12) and x.dtype == y.dtype == torch.long
    assert torch.equal(y[:, :-1], x[:, 1:]) and int(x.max()) < 40
    again = Plan(cfg).data
    again.setup()
    assert torch.equal(again.train_set[:8][0], x)
    pairs = {pair for row in torch.cat([x, y[:, -1:]], 1).tolist() for pair in pairwise(row)}
    assert max(Counter(a for a, _ in pairs).values()) <= 4  # at most 4 next tokens each


def test_a_gpt2_sized_vocabulary_draws_distinct_successors_without_a_table_per_token():
    """50,304 tokens: a permutation per token would draw 2.5e9 numbers and hold 20 GB."""
    from tuneup.zoo.data.tokens import successor_table

    table = successor_table(50_304, torch.Generator().manual_seed(0))
    assert table.shape == (50_304, 4) and int(table.min()) >= 0 and int(table.max()) < 50_304
    ordered = table.sort(dim=1).values
    assert not (ordered[:, 1:] == ordered[:, :-1]).any()  # four distinct successors each
    again = successor_table(50_304, torch.Generator().manual_seed(0))
    assert torch.equal(table, again)


def text_config(path, *overrides):
    return compose_config(
        ["data=textfile", f"data.path={path}", "data.context=8", "data.batch_size=2", *overrides],
        tiny=False,
    )


def test_textfile_is_bytes_split_into_train_and_validation(tmp_path):
    text = "héllo wörld, " * 20  # UTF-8: multi-byte characters are several byte tokens
    path = tmp_path / "input.txt"
    path.write_text(text, encoding="utf-8")
    data = Plan(text_config(path, "data.val_fraction=0.25")).data
    assert data.input_shape == (8,) and data.num_classes == 256
    data.setup()
    raw = text.encode()
    cut = len(raw) - len(raw) // 4
    x, y = data.train_set[1]
    assert bytes(x.tolist()) == raw[8:16] and bytes(y.tolist()) == raw[9:17]
    assert len(data.train_set) == (cut - 1) // 8
    assert bytes(data.val_set[0][0].tolist()) == raw[cut : cut + 8]


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "does not exist: give a UTF-8 text file"),
        ("", "is empty: give a file with text in it"),
        (
            "short text",
            "its validation part (data.val_fraction=0.1) has 1, fewer than one sequence",
        ),
    ],
)
def test_missing_empty_or_short_text_file_is_a_clear_error(tmp_path, content, expected):
    path = tmp_path / "input.txt"
    if content is not None:
        path.write_text(content)
    (found,) = check_data(text_config(path))
    assert found.startswith(f"data.path='{path}'") and expected in found


def test_gpt_trains_on_a_text_file(tmp_path, train):
    path = tmp_path / "input.txt"
    path.write_text("To be, or not to be, that is the question. " * 40)
    summary, _ = train(
        "model=gpt",
        "data=textfile",
        f"data.path={path}",
        "data.context=16",
        "data.batch_size=8",
        "model.width=16",
        "model.layers=1",
        "trainer.max_epochs=1",
        tiny=False,
    )
    assert (
        summary["status"] == "ok"
        and summary["steps"] == (len(path.read_bytes()) * 9 // 10 - 1) // 16 // 8
    )


@pytest.mark.parametrize("data", ["synthetic_images", "synthetic_tokens"])
def test_a_batch_larger_than_the_training_set_is_a_check_error(tmp_path, data):
    from tests.conftest import compose_config
    from tuneup.trainer.runner import ConfigError, run

    cfg = compose_config(
        [f"data={data}", "data.train_samples=16", "data.batch_size=32"], tiny=False
    )
    with pytest.raises(
        ConfigError, match=r"data.batch_size=32 is larger than data.train_samples=16"
    ):
        run(cfg, run_dir=tmp_path)


def test_an_epoch_without_a_full_batch_is_refused_naming_the_largest_batch():
    """Each process's share of the training samples, in full batches: a batch above it would
    train 0 steps and end "ok" (a data set of the user's, or processes splitting the zoo's)."""
    from tuneup import TuneupError
    from tuneup.trainer.state.data_order import ResumableSampler, check_a_full_batch

    check_a_full_batch(ResumableSampler(48, num_replicas=2), 24)  # one full batch each: trains
    with pytest.raises(TuneupError) as error:
        check_a_full_batch(ResumableSampler(48, num_replicas=2), 32)
    assert str(error.value) == (
        "data.batch_size=32 is larger than the 24 training samples of each of the 2 processes "
        "(48 in all): training batches are full, so an epoch would train nothing; lower "
        "data.batch_size to 24 or less, or give more training samples"
    )
