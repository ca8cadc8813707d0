"""The worked example of docs/plugins.md: a plugin package with its own config group, built and
installed with pip exactly as the docs show, then used as its users would."""

import json
import re
import subprocess
import sys

import pytest
import torch

from tests.conftest import ROOT, compose_config, run_cli
from tuneup.trainer.runner import ConfigError, run

DOC = ROOT / "docs" / "plugins.md"
FILES = {  # docs block -> path in the package
    "module": "tuneup_ema/__init__.py",
    "on.yaml": "tuneup_ema/conf/ema/on.yaml",
    "off.yaml": "tuneup_ema/conf/ema/off.yaml",
    "pyproject": "pyproject.toml",
}


def block(marker: str) -> str:
    match = re.search(rf"<!-- example:{marker} -->\n```\w+\n(.*?)```", DOC.read_text(), re.DOTALL)
    assert match, f"docs/plugins.md has no example:{marker} block"
    return match.group(1)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """tuneup-ema written from the docs and pip-installed into a folder (no deps, no network)."""
    source, site = tmp_path_factory.mktemp("tuneup-ema"), tmp_path_factory.mktemp("site")
    for marker, path in FILES.items():
        (source / path).parent.mkdir(parents=True, exist_ok=True)
        (source / path).write_text(block(marker))
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                    "--no-build-isolation", "--no-index", "--target", str(site), str(source)],
                   check=True, capture_output=True)  # fmt: skip
    assert (site / "tuneup_ema" / "conf" / "ema" / "on.yaml").is_file()  # package data shipped
    return site


@pytest.fixture
def installed(site, monkeypatch):
    monkeypatch.syspath_prepend(str(site))
    return site


def final_weights(run_dir):
    newest = sorted((run_dir / "checkpoints").glob("epoch*.ckpt"))[-1]
    return torch.load(newest, weights_only=True)["state_dict"]


def test_ema_is_off_until_chosen_and_validates_the_average(installed, tmp_path):
    tiny = ["model=mlp", "data.train_samples=256", "data.val_samples=128", "data.batch_size=32",
            "trainer.max_epochs=2", "optimizer.lr=0.2", "trainer.enable_progress_bar=false"]  # fmt: skip
    run(compose_config(tiny, tiny=False), run_dir=tmp_path / "plain")
    plain = json.loads((tmp_path / "plain" / "summary.json").read_text())
    assert "ema" not in plain["plugins"]  # installed, but off by default

    run(compose_config([*tiny, "ema=on", "ema.decay=0.9"], tiny=False), run_dir=tmp_path / "ema")
    ema = json.loads((tmp_path / "ema" / "summary.json").read_text())
    assert ema["plugins"]["ema"] == {"decay": 0.9, "every_n_steps": 1}  # built with the cfg
    assert ema["ema"] == {"decay": 0.9, "last_averaged_step": ema["steps"]}
    # validation saw the averaged weights, training and its checkpoints the trained ones
    assert ema["val"]["loss"] != plain["val"]["loss"]
    trained, averaged_run = final_weights(tmp_path / "plain"), final_weights(tmp_path / "ema")
    assert all(torch.equal(trained[k], averaged_run[k]) for k in trained)
    state = torch.load(sorted((tmp_path / "ema" / "checkpoints").glob("epoch*.ckpt"))[-1],
                       weights_only=True)["tuneup"]["ema"]  # fmt: skip
    assert state["step"] == ema["steps"] and len(state["average"]) == len(trained)


def test_bad_value_is_a_one_line_error_like_a_builtin(installed, tmp_path):
    with pytest.raises(ConfigError, match=r"\[ema\] ema.decay=2 is not allowed: expected a "
                       r"number > 0 and < 1"):  # fmt: skip
        run(compose_config(["ema=on", "ema.decay=2"]), run_dir=tmp_path)


def test_command_line_help_and_listing_show_the_plugin_group(site, tmp_path):
    env = {"PYTHONPATH": str(site)}
    help_text = run_cli("--help", env=env, tiny=False).stdout
    assert re.search(r"plugin ema \(.*conf\):\n  ema +off\*, on", help_text)
    listing = run_cli("ema=on", "ema.decay=0.5", "plugins.list=true", env=env)
    assert listing.returncode == 0, listing.stderr[-2000:]
    assert "entry point 'tuneup_ema:Plugin' of tuneup-ema 0.1.0" in listing.stdout
    assert "settings: {'decay': 0.5, 'every_n_steps': 1}" in listing.stdout
    assert re.search(r"on_validation_start +ema", listing.stdout)
