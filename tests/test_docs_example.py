"""The worked example of docs/plugins.md: a plugin package with its own config group, built and
installed with pip exactly as the docs show, then used as its users would."""

import csv
import json
import math
import re
import subprocess
import sys

import pytest
import torch

from tests.conftest import ROOT, compose_config, run_cli
from tuneup.trainer.runner import ConfigError, run

DOC = ROOT / "docs" / "plugins.md"
FILES = {  # docs block -> path in the package
    "module": "tuneup_polyak/__init__.py",
    "on.yaml": "tuneup_polyak/conf/polyak/on.yaml",
    "off.yaml": "tuneup_polyak/conf/polyak/off.yaml",
    "pyproject": "pyproject.toml",
}
HELLO = {"hello": "tuneup_hello/__init__.py", "hello-pyproject": "pyproject.toml"}


def block(marker: str) -> str:
    match = re.search(rf"<!-- example:{marker} -->\n```\w+\n(.*?)```", DOC.read_text(), re.DOTALL)
    assert match, f"docs/plugins.md has no example:{marker} block"
    return match.group(1)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """tuneup-hello and tuneup-polyak written from the docs and pip-installed into a folder (no
    deps, no network)."""
    site, sources = tmp_path_factory.mktemp("site"), []
    for name, files in (("tuneup-polyak", FILES), ("tuneup-hello", HELLO)):
        sources.append(source := tmp_path_factory.mktemp(name))
        for marker, path in files.items():
            (source / path).parent.mkdir(parents=True, exist_ok=True)
            (source / path).write_text(block(marker))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--target",
            str(site),
            *map(str, sources),
        ],
        check=True,
        capture_output=True,
    )
    assert (
        site / "tuneup_polyak" / "conf" / "polyak" / "on.yaml"
    ).is_file()  # package data shipped
    return site


@pytest.fixture
def installed(site, monkeypatch):
    monkeypatch.syspath_prepend(str(site))
    return site


def final_weights(run_dir):
    newest = sorted((run_dir / "checkpoints").glob("epoch*.ckpt"))[-1]
    return torch.load(newest, weights_only=True)["state_dict"]


def test_hello_logs_and_polyak_is_off_until_chosen_and_validates_the_average(
    installed, tmp_path, capfd
):
    tiny = [
        "model=mlp",
        "data.train_samples=256",
        "data.val_samples=128",
        "data.batch_size=32",
        "trainer.max_epochs=2",
        "optimizer.lr=0.2",
        "trainer.enable_progress_bar=false",
    ]
    run(compose_config(tiny, tiny=False), run_dir=tmp_path / "plain")
    plain = json.loads((tmp_path / "plain" / "summary.json").read_text())
    assert "polyak" not in plain["plugins"]  # installed, but off by default
    # tuneup-hello, installed without a config group: always on; it prints on the run's
    # standard output, and its metric is in metrics.csv
    assert "hello" in plain["plugins"]
    assert "hello from tuneup-hello: 1 process(es)" in capfd.readouterr().out
    with open(tmp_path / "plain" / "metrics.csv") as f:
        rows = [r for r in csv.DictReader(f) if r.get("hello/lr")]
    assert rows and all(
        float(r["hello/lr"])
        == pytest.approx(0.2 * 0.5 * (1 + math.cos(math.pi * int(r["step"]) / 16)), rel=1e-5)
        for r in rows
    )  # the lr after the step's update: row N, after N optimizer steps, has the schedule at N

    run(
        compose_config([*tiny, "polyak=on", "polyak.decay=0.9"], tiny=False),
        run_dir=tmp_path / "polyak",
    )
    polyak = json.loads((tmp_path / "polyak" / "summary.json").read_text())
    assert polyak["plugins"]["polyak"] == {"decay": 0.9, "every_n_steps": 1}  # built with the cfg
    assert polyak["polyak"] == {"decay": 0.9, "last_averaged_step": polyak["steps"]}
    # validation saw the averaged weights, training and its checkpoints the trained ones
    assert polyak["val"]["loss"] != plain["val"]["loss"]
    trained, averaged_run = final_weights(tmp_path / "plain"), final_weights(tmp_path / "polyak")
    assert all(torch.equal(trained[k], averaged_run[k]) for k in trained)
    state = torch.load(
        sorted((tmp_path / "polyak" / "checkpoints").glob("epoch*.ckpt"))[-1], weights_only=True
    )["tuneup"]["polyak"]
    assert state["step"] == polyak["steps"] and len(state["average"]) == len(trained)


def test_bad_value_is_a_one_line_error_like_a_builtin(installed, tmp_path):
    with pytest.raises(
        ConfigError,
        match=r"\[polyak\] polyak.decay=2 is not allowed: expected a "
        r"number > 0 and < 1",
    ):
        run(compose_config(["polyak=on", "polyak.decay=2"]), run_dir=tmp_path)


def test_command_line_help_and_listing_show_the_plugin_group(site, tmp_path):
    env = {"PYTHONPATH": str(site)}
    help_text = run_cli("--help", env=env, tiny=False).stdout
    assert re.search(r"plugin polyak \(.*conf\):\n  polyak +off\*, on", help_text)
    listing = run_cli("polyak=on", "polyak.decay=0.5", "plugins.list=true", env=env)
    assert listing.returncode == 0, listing.stderr[-2000:]
    assert "entry point 'tuneup_polyak:Plugin' of tuneup-polyak 0.1.0" in listing.stdout
    assert "settings: {'decay': 0.5, 'every_n_steps': 1}" in listing.stdout
    assert re.search(r"on_validation_start +[\w >-]*\bpolyak\b", listing.stdout)
