"""What docs/plugins.md and trainer/hookspecs.py tell a plugin author, measured by a plugin that
records what it sees: under fp16 the gradients at on_before_optimizer_step are unscaled, the
hook fires on the steps the loss scaler skips, and __init__ runs before check."""

from __future__ import annotations

import json
import math

import pytest

from tests.conftest import ROOT, compose_config
from tests.plugin_dists import make_distribution
from tuneup.trainer import hookspecs
from tuneup.trainer.runner import run

RECORDER = """
    import math

    from tuneup import hookimpl

    SEEN = []


    def norm(module):
        grads = [p.grad for p in module.parameters() if p.grad is not None]
        return math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads))


    class Plugin:
        def __init__(self, cfg):
            SEEN.append(("init",))

        @hookimpl
        def check(self):
            SEEN.append(("check",))

        @hookimpl
        def on_after_backward(self, module):
            SEEN.append(("after_backward", norm(module)))

        @hookimpl
        def on_before_optimizer_step(self, trainer, module):
            scaler = trainer.precision_plugin.scaler
            SEEN.append(("before_step", norm(module), float(scaler.get_scale())))

        @hookimpl
        def on_train_batch_end(self, module):
            SEEN.append(("batch_end", norm(module)))  # after the step, before the next zero_grad
"""


@pytest.fixture
def seen(tmp_path, monkeypatch):
    """What the recording plugin (installed, always on) saw in this test's runs."""
    site = make_distribution(
        tmp_path / "site",
        "tuneup-recorder",
        {"tuneup_recorder": RECORDER},
        {"recorder": "tuneup_recorder:Plugin"},
    )
    monkeypatch.syspath_prepend(str(site))
    import tuneup_recorder

    tuneup_recorder.SEEN.clear()  # imported once per process
    return tuneup_recorder.SEEN


def fp16_run(tmp_path, *overrides):
    run(
        compose_config(
            [
                "precision=fp16",
                "trainer.max_steps=4",
                "checkpoint=off",
                "data.image_size=8",
                *overrides,
            ]
        ),
        run_dir=tmp_path / "run",
    )
    return json.loads((tmp_path / "run" / "summary.json").read_text())


def test_init_runs_before_check_and_fp16_gradients_are_unscaled_before_the_step(seen, tmp_path):
    summary = fp16_run(tmp_path, "optimizer.clip_grad_norm=0.01")
    assert [s[0] for s in seen[:2]] == ["init", "check"]
    after = [s[1] for s in seen if s[0] == "after_backward"]
    before = [s for s in seen if s[0] == "before_step"]
    clipped = [s[1] for s in seen if s[0] == "batch_end"]
    assert len(after) == len(before) == len(clipped) == 4
    for scaled, (_, unscaled, scale), end in zip(after, before, clipped, strict=True):
        assert scale == 65536.0  # no inf/NaN here: the scale stays
        assert unscaled == pytest.approx(scaled / scale, rel=1e-3)
        assert unscaled > 0.02 and end <= 0.01 * 1.001  # clipped: the real gradients
    assert summary["grad_norm"]["clipped_steps"] == 4  # the norm before clipping, unscaled
    assert summary["grad_norm"]["last"] == pytest.approx(before[-1][1], rel=1e-3)


def test_before_optimizer_step_fires_on_the_steps_fp16_skips(seen, tmp_path):
    summary = fp16_run(tmp_path, "precision.init_scale=1e38")  # float16 overflows at first
    before = [s for s in seen if s[0] == "before_step"]
    overflowed = [s for s in before if not math.isfinite(s[1])]
    assert len(before) == 4 and summary["steps"] == 4
    assert len(overflowed) == summary["precision"]["skipped_steps"] > 0


def test_the_plugin_docs_state_what_these_tests_measure():
    docs = " ".join((ROOT / "docs" / "plugins.md").read_text().split())
    for fact in (
        "`__init__` runs when the run loads its plugins, before any `check`",
        "gradients at `on_before_optimizer_step` are already unscaled",
        "`on_before_optimizer_step` fires also on the steps the loss scaler then skips",
        "`optimizer.clip_grad_norm=<norm>` clips right after that hook",
    ):
        assert fact in docs, fact
    spec = " ".join(hookspecs.on_before_optimizer_step.__doc__.split())
    assert "already unscaled" in spec and "the steps the scaler then skips" in spec
    assert "optimizer.clip_grad_norm" in spec
    assert "``__init__(cfg)`` runs when the run loads its plugins" in " ".join(
        hookspecs.check.__doc__.split()
    )
