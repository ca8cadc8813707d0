"""Data in shards: tuneup-shards converts, data=shards trains as the source does, resumes
exactly after kill -9, shards over DDP ranks, and names the file when something is wrong.

The data are made here: a few dozen small JPEGs and PNGs in class folders, and a text file
of 16-byte records ``w00042 abcdefgh\\n``, so that a 16-token window is one record and its
number says which sample a batch held.
"""

from __future__ import annotations

import importlib.util
import io
import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import compose_config, run_cli
from tests.plugin_dists import make_distribution
from tests.test_data import make_image_folder
from tests.test_resume import CRASH, ONE_THREAD, assert_bitwise_equal
from tuneup.shards import main as convert
from tuneup.trainer.components import Plan
from tuneup.trainer.state.checkpoints import checkpoint_name, list_checkpoints
from tuneup.trainer.state.data_order import ResumableSampler
from tuneup.zoo.data import check_data
from tuneup.zoo.data.shard_reader import OpenShard, ShardError, ShardRecords, read_descriptor
from tuneup.zoo.data.tokens import Windows

RECORD = 16  # bytes per record of the text file: one window of data.context=16
TEXT_RUN = [
    "model=gpt",
    "model.layers=1",
    "model.width=8",
    "data=shards",
    "data.train_samples=96",
    "data.val_samples=16",
    "data.batch_size=8",
    "trainer.enable_progress_bar=false",
]
IMAGE_RUN = [
    "model=mlp",
    "model.hidden=[16]",
    "data.image_size=16",
    "data.batch_size=4",
    "trainer.max_epochs=2",
    "trainer.enable_progress_bar=false",
    "dataloader=workers",
    "dataloader.num_workers=1",
]

#: A plugin that writes, per rank, the epoch and the record numbers of every training batch.
SEEN = """
import os
from tuneup import hookimpl


class Plugin:
    @hookimpl
    def on_train_batch_start(self, trainer, batch):
        folder = os.environ.get("SEEN_DIR")
        if folder:
            ids = [str(int(bytes(row[1:6].tolist()))) for row in batch[0].cpu()]
            with open(os.path.join(folder, f"rank{trainer.global_rank}.txt"), "a") as f:
                f.write(" ".join([str(trainer.current_epoch), *ids]) + "\\n")
"""


def write_text(path: Path, records: int = 160) -> Path:
    path.write_bytes(b"".join(b"w%05d abcdefgh\n" % i for i in range(records)))
    return path


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> tuple[Path, Path]:
    """(an image folder of 24 + 8 images, its shards: several, 3 images at most each)."""
    root = tmp_path_factory.mktemp("shards")
    folder = make_image_folder(root / "folder", per_class=(12, 4))
    code = convert(
        [str(folder), str(root / "shards"), "--shard-size", "5KB", "--workers", "2", "--quiet"]
    )
    assert code == 0
    return folder, root / "shards"


@pytest.fixture(scope="module")
def text(tmp_path_factory) -> tuple[Path, Path]:
    """(a text file of 160 records, its shards of 16-token windows, 25% for validation)."""
    root = tmp_path_factory.mktemp("text")
    source = write_text(root / "records.txt")
    code = convert(
        [
            str(source),
            str(root / "shards"),
            "--context",
            str(RECORD),
            "--val-fraction",
            "0.25",
            "--shard-size",
            "20KB",
            "--quiet",
        ]
    )
    assert code == 0
    return source, root / "shards"


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """Plugins for the subprocess runs: the batch recorder above, and test_resume's killer."""
    return make_distribution(
        tmp_path_factory.mktemp("site"),
        "tuneup-shards-probes",
        {"shards_seen": SEEN, "shards_crash": CRASH},
        {"seen": "shards_seen:Plugin", "crash": "shards_crash:Plugin"},
    )


def image_data(overrides: list[str]):
    cfg = compose_config(["data.image_size=16", "data.batch_size=4", *overrides], tiny=False)
    data = Plan(cfg).data
    data.setup()
    return data


# -- converting -------------------------------------------------------------------------------


def test_converter_keeps_every_image_s_bytes_and_label_in_the_folder_s_order(images):
    folder, shards = images
    from_folder = image_data(["data=imagefolder", f"data.root={folder}"])
    from_shards = image_data(["data=shards", f"data.path={shards}"])
    assert from_shards.classes == from_folder.classes == ["blue", "red"]
    assert len(read_descriptor(shards, "train")["shardlist"]) > 4  # several shards
    for split in ("train_set", "val_set"):
        files = getattr(from_folder, split).samples
        stored = getattr(from_shards, split).samples
        assert len(stored) == len(files) == {"train_set": 24, "val_set": 8}[split]
        for (path, label), (image, stored_label) in zip(files, stored, strict=True):
            assert image.data == Path(path).read_bytes() and stored_label == label
            assert image.suffix == Path(path).suffix.lower()  # .PNG files stay PNG


def test_converter_cuts_the_text_into_textfile_s_windows(text):
    source, shards = text
    cfg = ["data.batch_size=8", "data.context=16", "data.val_fraction=0.25"]
    textfile = Plan(compose_config(["data=textfile", f"data.path={source}", *cfg], tiny=False)).data
    stored = Plan(compose_config(["data=shards", f"data.path={shards}"], tiny=False)).data
    textfile.setup(), stored.setup()
    assert stored.input_shape == (16,) and stored.num_classes == 256
    for split in ("train_set", "val_set"):
        expected, got = getattr(textfile, split), getattr(stored, split)
        assert isinstance(expected, Windows) and len(got) == len(expected) > 0
        for i in range(len(expected)):
            assert all(torch.equal(a, b) for a, b in zip(got[i], expected[i], strict=True))


def test_resize_re_encodes_jpegs_with_the_shorter_side_at_most_the_size(images, tmp_path):
    from PIL import Image

    folder, _ = images
    assert convert([str(folder), str(tmp_path / "small"), "--resize", "20", "--quiet"]) == 0
    info = read_descriptor(tmp_path / "small", "train")["tuneup"]
    assert info["resize"] == 20 and info["formats"] == {"jpg": 24}
    labels = [
        label
        for _, label in image_data(["data=imagefolder", f"data.root={folder}"]).train_set.samples
    ]
    stored = image_data(["data=shards", f"data.path={tmp_path / 'small'}"]).train_set.samples
    for (image, label), expected in zip(stored, labels, strict=True):
        decoded = Image.open(io.BytesIO(image.data))
        assert decoded.format == "JPEG" and min(decoded.size) == 20 and label == expected


def test_an_interrupted_conversion_is_finished_by_running_it_again(images, tmp_path, capsys):
    folder, shards = images
    copy = tmp_path / "copy"
    shutil.copytree(shards, copy)
    first, second = copy / "train" / "000000.tar", copy / "train" / "000001.tar"
    whole = first.read_bytes()
    first.unlink(), (copy / "train.json").unlink(), (copy / "val.json").unlink()
    second.rename(second.with_name(".000001.tar.tmp-1234"))  # a worker killed while writing
    assert convert([str(folder), str(copy), "--shard-size", "5KB", "--quiet"]) == 0
    assert "(2 written, " in capsys.readouterr().out
    assert first.read_bytes() == whole  # the same bytes as the uninterrupted conversion
    assert not list(copy.glob("*/.*.tmp-*"))
    assert (copy / "train.json").read_text() == (shards / "train.json").read_text()
    # Another source or other options into the same folder: refused, not mixed.
    assert convert([str(folder), str(copy), "--shard-size", "6KB", "--quiet"]) == 1
    assert "holds shards of another conversion" in capsys.readouterr().err


def test_every_worker_transform_reads_a_shard_s_bytes_as_it_reads_the_file(images):
    """The same crop, flip and pixels from the bytes in a shard as from the file: the training
    crop, the validation crop and data.decoder=nvjpeg's worker part (bytes, box, flip)."""
    from tuneup.zoo.data.transforms import CenterCrop, Encoded, TrainCrop

    folder, shards = images
    files = image_data(["data=imagefolder", f"data.root={folder}"]).train_set.samples
    stored = image_data(["data=shards", f"data.path={shards}"]).train_set.samples
    for transform in (TrainCrop(16, draft=True), CenterCrop(16), Encoded(TrainCrop(16))):
        for i in (0, 1, 2):  # a JPEG, a PNG, a greyscale JPEG
            torch.manual_seed(i)
            expected = transform(files[i][0])
            torch.manual_seed(i)
            got = transform(stored[i][0])
            for a, b in zip(got, expected, strict=True):
                assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b


# -- training ---------------------------------------------------------------------------------


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    newest = list_checkpoints(run_dir / "checkpoints")[0]
    return torch.load(newest, map_location="cpu", weights_only=False)["state_dict"]


def test_training_from_shards_equals_training_from_the_folder(images, train, tmp_path):
    folder, shards = images
    _, from_folder = train(
        *IMAGE_RUN,
        "data=imagefolder",
        f"data.root={folder}",
        tiny=False,
        run_dir=tmp_path / "folder",
    )
    summary, from_shards = train(
        *IMAGE_RUN, "data=shards", f"data.path={shards}", tiny=False, run_dir=tmp_path / "shards"
    )
    assert summary["steps"] == 12 and summary["data_path"]["batches"] == "uint8"
    assert summary["data_path"]["worker"].startswith("read from shard, decode (pillow")
    expected, got = weights(from_folder), weights(from_shards)
    assert all(torch.equal(got[k], expected[k]) for k in expected)
    _, reordered = train(
        *IMAGE_RUN,
        "data=shards",
        f"data.path={shards}",
        "seed=7",
        tiny=False,
        run_dir=tmp_path / "seed7",
    )
    other = weights(reordered)  # another seed, another order: other weights
    assert not all(torch.equal(other[k], expected[k]) for k in expected)


def test_gpt_trains_on_token_shards_as_on_the_text_file(text, train, tmp_path):
    source, shards = text
    run = [*TEXT_RUN, "trainer.max_epochs=1", "data.train_samples=32"]
    _, from_text = train(
        *run,
        "data=textfile",
        f"data.path={source}",
        "data.context=16",
        "data.val_fraction=0.25",
        tiny=False,
        run_dir=tmp_path / "text",
    )
    _, from_shards = train(*run, f"data.path={shards}", tiny=False, run_dir=tmp_path / "shards")
    expected, got = weights(from_text), weights(from_shards)
    assert all(torch.equal(got[k], expected[k]) for k in expected)


class ByteBigram(torch.nn.Module):
    """A user's own token model (``model=custom``): the next byte from this one."""

    def __init__(self) -> None:
        super().__init__()
        self.table = torch.nn.Embedding(256, 256)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.table(tokens)


def test_a_user_s_own_model_trains_on_token_shards(text, train):
    _, shards = text
    summary, _ = train(
        "model=custom",
        "model._target_=tests.test_shards.ByteBigram",
        *TEXT_RUN[3:],
        f"data.path={shards}",
        "trainer.max_steps=3",
        "optimizer=adamw",
        "optimizer.lr=0.1",
        tiny=False,
    )
    assert summary["status"] == "ok" and summary["steps"] == 3
    assert summary["data_path"]["batches"] == "int64 tokens"


def shard_run(run_dir: Path, shards: Path, site: Path, *args: str, env: dict | None = None):
    """``python run.py`` on the token shards, with the probes installed; must exit 0 unless
    ``env`` asks the crash plugin to kill it."""
    env = {**ONE_THREAD, "PYTHONPATH": str(site), **(env or {})}
    return run_cli(
        f"hydra.run.dir={run_dir}", *TEXT_RUN, f"data.path={shards}", *args, tiny=False, env=env
    )


def test_kill_9_mid_epoch_resumes_exactly_reading_shards_in_a_worker(text, site, tmp_path):
    """2 epochs of 12 micro-batches, a checkpoint every 5 steps, dropout: killed during
    micro-batch 18 (epoch 2), resumed from step 15 (3 batches into epoch 2), the final weights
    are the uninterrupted run's."""
    _, shards = text
    run = [
        "model.dropout=0.1",
        "trainer.max_epochs=2",
        "checkpoint.every_n_steps=5",
        "dataloader=workers",
        "dataloader.num_workers=1",
    ]
    reference = shard_run(tmp_path / "reference", shards, site, *run)
    assert reference.returncode == 0, reference.stderr[-3000:]
    killed = shard_run(tmp_path / "run", shards, site, *run, env={"CRASH_AT_MICRO_BATCH": "18"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert list_checkpoints(tmp_path / "run" / "checkpoints")[0].name == checkpoint_name(1, 15)
    resumed = shard_run(tmp_path / "run", shards, site, *run, "resume=auto")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_bitwise_equal(tmp_path / "run", tmp_path / "reference")


def seen(folder: Path) -> dict[int, dict[int, list[int]]]:
    """{rank: {epoch: record numbers in the order trained}} from the recorder's files."""
    found: dict[int, dict[int, list[int]]] = {}
    for path in folder.glob("rank*.txt"):
        rank = found.setdefault(int(path.stem[4:]), {})
        for line in path.read_text().splitlines():
            epoch, *ids = map(int, line.split())
            rank.setdefault(epoch, []).extend(ids)
    return found


def test_ddp_ranks_share_each_epoch_without_a_sample_twice_and_resume_on_one_process(
    text, site, tmp_path
):
    """2 processes x 2 epochs: each epoch's 96 samples once, split between the ranks; from the
    end of epoch 1 resumed on 1 process, epoch 2 is the same samples in the (seed, epoch) order
    the ranks dealt between them; from mid-epoch on 1 process, the rest of epoch 1 in the same
    order, each sample once (trainer/state/layout.py)."""
    _, shards = text
    two = tmp_path / "two"
    (two / "seen").mkdir(parents=True)
    ddp = [
        "strategy=ddp",
        "trainer.devices=2",
        "trainer.accelerator=cpu",
        "trainer.max_epochs=2",
        "checkpoint.every_n_steps=1",
        "checkpoint.keep_last=null",
    ]
    result = shard_run(two, shards, site, *ddp, env={"SEEN_DIR": str(two / "seen")})
    assert result.returncode == 0, result.stderr[-3000:]
    by_rank = seen(two / "seen")
    assert sorted(by_rank) == [0, 1]
    for epoch in (0, 1):
        rank0, rank1 = by_rank[0][epoch], by_rank[1][epoch]
        assert len(rank0) == len(rank1) == 48 and not set(rank0) & set(rank1)
        assert sorted(rank0 + rank1) == list(range(96))  # every sample once per epoch
    order = ResumableSampler(96, seed=compose_config([], tiny=False).seed).order(1)
    assert by_rank[0][1] == order[0::2] and by_rank[1][1] == order[1::2]

    def saved_at(step: int) -> Path:
        (path,) = (two / "checkpoints").glob(f"*-step{step:08d}.ckpt")
        return path

    one = tmp_path / "one"
    (one / "seen").mkdir(parents=True)
    result = shard_run(
        one,
        shards,
        site,
        "trainer.max_epochs=2",
        f"resume={saved_at(6)}",
        env={"SEEN_DIR": str(one / "seen")},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert seen(one / "seen") == {0: {1: order}}  # the ranks' epoch 2, interleaved as dealt

    middle = tmp_path / "middle"  # mid-epoch: the rest of epoch 1 resharded, each sample once
    (middle / "seen").mkdir(parents=True)
    result = shard_run(
        middle,
        shards,
        site,
        "trainer.max_epochs=1",
        f"resume={saved_at(3)}",
        env={"SEEN_DIR": str(middle / "seen")},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    first = ResumableSampler(96, seed=compose_config([], tiny=False).seed).permutation(0)
    assert seen(middle / "seen") == {0: {0: first[48:]}}
    assert "global batch changed from 16 to 8: the remaining 48 samples of epoch 0" in (
        result.stdout + result.stderr
    )


# -- errors -----------------------------------------------------------------------------------


def test_a_missing_folder_or_a_half_written_shard_is_named_in_one_line(images, tmp_path, cli):
    _, shards = images
    nowhere = tmp_path / "nowhere"
    (found,) = check_data(compose_config(["data=shards", f"data.path={nowhere}"], tiny=False))
    assert found == (
        f"data.path='{nowhere}': {nowhere} does not exist; convert an image folder "
        f"or a text file into it first: tuneup-shards SRC {nowhere}"
    )
    (found,) = check_data(compose_config(["data=shards", f"data.path={tmp_path}"], tiny=False))
    assert f"{tmp_path / 'train.json'} does not exist: not a folder of shards" in found

    copy = tmp_path / "copy"
    shutil.copytree(shards, copy)
    cut_short = copy / "val" / "000001.tar"
    cut_short.write_bytes(cut_short.read_bytes()[:3000])
    result = cli("data=shards", f"data.path={copy}", *IMAGE_RUN, tiny=False)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    (line,) = [line for line in result.stderr.splitlines() if str(cut_short) in line]
    assert f"{cut_short} is 3000 bytes, not the 10240 its descriptor lists: a half-written" in line


def test_a_damaged_shard_of_the_right_size_is_named_when_read(images, tmp_path):
    _, shards = images
    copy = tmp_path / "copy"
    shutil.copytree(shards, copy)
    damaged = copy / "train" / "000000.tar"
    damaged.write_bytes(b"\x07" * damaged.stat().st_size)
    records = ShardRecords(copy, read_descriptor(copy, "train"))
    with pytest.raises(ShardError, match=f"^{damaged} is not a whole WebDataset shard"):
        records[0]
    assert records[len(records) - 1][".cls"] in (b"0", b"1")  # the other shards still read
    loader = torch.utils.data.DataLoader(records, num_workers=1, collate_fn=len)
    batches = iter(loader)
    with pytest.raises(ShardError) as raised:  # read in a worker: the same line, and where
        next(batches)
    batches._shutdown_workers()  # now, not in a later test's garbage collection (5 s there)
    assert str(raised.value).startswith(f"{damaged} is not a whole WebDataset shard")
    assert str(raised.value).endswith(" (in DataLoader worker process 0)")
    assert "\n" not in str(raised.value)


def test_an_open_shard_keeps_wids_s_index_in_arrays_and_reads_what_wids_reads(images):
    from wids.wids import IndexedTarSamples

    _, shards = images
    path = str(shards / "train" / "000000.tar")
    plain = IndexedTarSamples(path=path)
    expected = [
        {k: v.getvalue() for k, v in plain[i].items() if k != "__key__"} for i in range(len(plain))
    ]
    slim = OpenShard(IndexedTarSamples(path=path))
    assert slim.offsets is not None and slim.samples.reader.by_index == []  # objects freed
    assert [slim[i] for i in range(len(expected))] == expected

    class OtherLayout:  # a wids whose index is laid out otherwise: used as it is
        def __getitem__(self, index):
            return plain[index]

    other = OpenShard(OtherLayout())
    assert other.offsets is None and other[0] == expected[0]


def test_without_the_extra_the_check_and_the_converter_name_it(images, monkeypatch, capsys):
    folder, shards = images
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name in ("wids", "webdataset") else real(name, *a),
    )
    assert check_data(compose_config(["data=shards", f"data.path={shards}"], tiny=False)) == [
        "data=shards reads WebDataset shards through wids, wids not installed: "
        "pip install 'tuneup[shards]'"
    ]
    assert convert([str(folder), str(folder.parent / "elsewhere")]) == 1
    assert capsys.readouterr().err == (
        "error: tuneup-shards writes WebDataset shards, and webdataset and wids not installed: "
        "pip install 'tuneup[shards]'\n"
    )


def test_the_console_script_is_installed_and_says_what_is_wrong_in_one_line(tmp_path):
    script = Path(sys.executable).parent / "tuneup-shards"  # [project.scripts]
    shown = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and "--shard-size" in shown.stdout and "--resize" in shown.stdout
    nowhere = tmp_path / "nowhere"
    failed = subprocess.run(
        [str(script), str(nowhere), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert failed.returncode == 1
    assert (
        failed.stderr == f"error: {nowhere} does not exist: give an image folder or a text file\n"
    )


def test_the_descriptor_is_wids_s_own(images):
    """Other tools read the shards: the descriptor is a wids dataset description."""
    _, shards = images
    descriptor = json.loads((shards / "train.json").read_text())
    assert descriptor["wids_version"] == 1
    assert sum(s["nsamples"] for s in descriptor["shardlist"]) == 24
