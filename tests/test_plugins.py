"""The plugin contract: entry points, disabling, ordering, naming of failures, state, listing."""

import json

import pytest
import torch

from tests.conftest import compose_config
from tests.plugin_dists import make_distribution
from tuneup.trainer.plugin_manager import PluginError, PluginManager
from tuneup.trainer.runner import run

COUNTER = """
    from tuneup import hookimpl

    class Plugin:
        def __init__(self):
            self.batches = 0

        @hookimpl
        def on_train_batch_end(self):
            self.batches += 1

        @hookimpl
        def report(self, summary):
            summary["counted_batches"] = self.batches

        def describe(self):
            return {"counts": "train batches"}

        def state_dict(self):
            return {"batches": self.batches}

        def load_state_dict(self, state):
            self.batches = state["batches"]
"""


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A directory on sys.path for distributions made by the test."""
    path = tmp_path / "site"
    path.mkdir()
    monkeypatch.syspath_prepend(str(path))
    return path


def test_entry_point_plugin_can_be_disabled(site, tmp_path, monkeypatch):
    make_distribution(
        site, "tuneup-counter", {"tuneup_counter": COUNTER}, {"counter": "tuneup_counter:Plugin"}
    )
    assert "counter" in PluginManager.from_config(compose_config()).sources
    assert (
        "counter"
        not in PluginManager.from_config(compose_config(["plugins.disable=[counter]"])).sources
    )
    assert (
        "counter"
        not in PluginManager.from_config(compose_config(["plugins.autoload=false"])).sources
    )
    monkeypatch.setenv("TUNEUP_DISABLE_PLUGIN_AUTOLOAD", "1")
    assert "counter" not in PluginManager.from_config(compose_config()).sources


def test_measurement_cannot_be_disabled():
    with pytest.raises(PluginError, match="'measure' is required"):
        PluginManager.from_config(compose_config(["plugins.disable=[measure]"]))


def test_unknown_builtin_plugin_is_named_with_the_known_ones():
    with pytest.raises(PluginError) as info:
        PluginManager.from_config(compose_config(["+speedup.plugin=warp_drive"]))
    message = str(info.value)
    assert "unknown plugin 'warp_drive'" in message and "speedup.plugin" in message
    assert "measure" in message and "logger" in message


def test_plugin_that_fails_to_import_is_named(site):
    make_distribution(
        site,
        "tuneup-broken",
        {"tuneup_broken": "import no_such_module\n"},
        {"broken": "tuneup_broken:Plugin"},
    )
    with pytest.raises(
        PluginError, match=r"plugin 'broken' .*failed to import: ModuleNotFoundError"
    ):
        PluginManager.from_config(compose_config())


def test_plugin_with_a_misspelled_hook_is_rejected_by_name(site):
    source = """
        from tuneup import hookimpl

        class Plugin:
            @hookimpl
            def on_train_batch_ende(self):
                pass
    """
    make_distribution(site, "tuneup-typo", {"tuneup_typo": source}, {"typo": "tuneup_typo:Plugin"})
    with pytest.raises(PluginError, match=r"plugin 'typo' is invalid.*on_train_batch_ende"):
        PluginManager.from_config(compose_config())


def test_plugin_raising_in_a_loop_hook_is_named_and_the_summary_kept(site, tmp_path):
    source = """
        from tuneup import hookimpl

        class Plugin:
            @hookimpl
            def on_train_batch_end(self, batch_idx):
                if batch_idx == 3:
                    raise RuntimeError("boom at batch 3")
    """
    make_distribution(site, "tuneup-bomb", {"tuneup_bomb": source}, {"bomb": "tuneup_bomb:Plugin"})
    with pytest.raises(
        PluginError,
        match=r"plugin 'bomb' failed in hook 'on_train_batch_end': "
        r"RuntimeError: boom at batch 3",
    ):
        run(compose_config(), run_dir=tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "failed" and "boom at batch 3" in summary["error"]
    assert summary["micro_batches"] == 3  # what was measured before the failure is kept


def test_plugin_raising_in_cli_run_exits_1_naming_it(cli, tmp_path):
    source = """
        from tuneup import hookimpl

        class Plugin:
            @hookimpl
            def check(self):
                raise ValueError("cannot check")
    """
    site = make_distribution(
        tmp_path / "site", "tuneup-bad", {"tuneup_bad": source}, {"bad": "tuneup_bad:Plugin"}
    )
    result = cli(env={"PYTHONPATH": str(site)})
    assert result.returncode == 1
    assert "plugin 'bad' failed in hook 'check': ValueError: cannot check" in result.stderr


def test_configure_model_order_is_declared_not_registration_order(site):
    source = """
        import torch
        from tuneup import hookimpl

        class First:
            @hookimpl(tryfirst=True)
            def configure_model(self, model):
                return torch.nn.Sequential(model)          # wraps the original

        class Last:
            @hookimpl(trylast=True)
            def configure_model(self, model):
                model.seen_by_last = type(model).__name__   # sees First's result

        class Middle:
            @hookimpl
            def configure_model(self, model):
                model.order = getattr(model, "order", []) + ["middle"]
    """
    # registration order deliberately opposite to the declared order
    make_distribution(
        site,
        "tuneup-order",
        {"tuneup_order": source},
        {
            "z_last": "tuneup_order:Last",
            "m": "tuneup_order:Middle",
            "a_first": "tuneup_order:First",
        },
    )
    pm = PluginManager.from_config(compose_config())
    order = [i.plugin_name for i in pm.call_order("configure_model")]
    assert order[0] == "a_first" and order[-1] == "z_last"
    model = pm.pipeline("configure_model", "model", torch.nn.Linear(2, 2), cfg=None)
    assert isinstance(model, torch.nn.Sequential)
    assert model.seen_by_last == "Sequential" and model.order == ["middle"]


def test_installed_entry_point_plugin_runs_is_listed_and_its_state_restored(site, tmp_path):
    make_distribution(
        site, "tuneup-counter", {"tuneup_counter": COUNTER}, {"counter": "tuneup_counter:Plugin"}
    )
    run(compose_config(["trainer.max_epochs=2"]), run_dir=tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["plugins"]["counter"] == {"counts": "train batches"}  # listed: describe()
    assert summary["counted_batches"] == summary["micro_batches"] == 2 * 256 // 32  # its hooks
    checkpoints = sorted((tmp_path / "checkpoints").glob("*.ckpt"))
    assert checkpoints, "Lightning's checkpoint at epoch end"
    state = torch.load(checkpoints[-1], weights_only=True)
    assert state["tuneup"]["counter"] == {"batches": 2 * 256 // 32}

    pm = PluginManager.from_config(compose_config())
    pm.load_state_dicts(state["tuneup"])
    assert pm.get_plugin("counter").batches == 16


def test_plugins_list_prints_plugins_hooks_and_order_without_training(cli, tmp_path):
    result = cli("plugins.list=true")
    assert result.returncode == 0, result.stderr[-2000:]
    out = result.stdout
    assert "Active plugins:" in out and "built-in tuneup.plugins.measure" in out
    assert "built-in tuneup.plugins.logger" in out and "settings: {'name': 'csv'}" in out
    hooks = {line.split()[0]: line for line in out.splitlines()[1:] if line.startswith("  ")}
    assert "measure (tryfirst)" in hooks["on_train_batch_start"]
    assert "logger" in hooks["configure_trainer"]
    assert not (tmp_path / "run" / "summary.json").exists()  # nothing was trained


def test_a_plugin_failing_in_report_is_named_and_the_other_figures_kept(site, tmp_path):
    """Issue 43 point 22: a probe plugin raising in ``report`` (``.numpy()`` on a DTensor) left
    summary.json with little more than the error; pluggy's call stopped at it."""
    source = """
        from tuneup import hookimpl

        class Plugin:
            @hookimpl
            def report(self, summary):
                summary["probe_started"] = True
                raise TypeError("can't convert a DTensor to numpy")
    """
    # a module name of its own: test_newcomer.py installs a `tuneup_probe` package with a conf/
    # folder, which an imported one of the same name would hide in the same worker
    make_distribution(
        site,
        "tuneup-report-probe",
        {"tuneup_report_probe": source},
        {"probe": "tuneup_report_probe:Plugin"},
    )
    assert run(compose_config(), run_dir=tmp_path) is not None  # the run's val acc, as always
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["report_errors"] == {"probe": "TypeError: can't convert a DTensor to numpy"}
    assert summary["status"] == "ok" and "error" not in summary  # the run itself is done
    assert summary["samples"] == 256 and summary["samples_per_s"] > 0  # measure's report
    assert summary["loss_curve"]["samples"][-1] == 256 and 0 <= summary["val"]["acc"] <= 1
    assert summary["per_rank"][0]["parameter_bytes"] > 0 and summary["probe_started"] is True
    log = (tmp_path / "tuneup.log").read_text()
    assert "plugin 'probe' failed in hook 'report': TypeError: can't convert" in log
    assert 'raise TypeError("can\'t convert a DTensor to numpy")' in log  # its traceback
