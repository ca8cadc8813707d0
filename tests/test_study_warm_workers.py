"""Warm workers (tuneup/optuna/warm.py): with several study workers under the joblib launcher,
every loky worker process imports what a trial imports before the study's first job, and the
jobs then run in those processes. One real launcher (Hydra's joblib launcher, 2 processes),
warmed with torch alone (a trial's full list would take seconds more per process)."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest

from tests.job_probe import probe
from tuneup.optuna import warm as warming

pytest.importorskip("hydra_plugins.hydra_joblib_launcher")


@pytest.fixture(scope="module")
def joblib_launcher(tmp_path_factory):
    """Hydra's joblib launcher as a sweep sets it up (hydra/launcher=joblib
    hydra.launcher.n_jobs=2), its task :func:`tests.job_probe.probe`; its processes are
    stopped after the module's tests."""
    from hydra._internal.callbacks import Callbacks
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.utils import create_config_search_path
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.plugins import Plugins
    from hydra.core.singleton import Singleton
    from hydra.types import HydraContext, RunMode
    from joblib.externals.loky import reusable_executor

    before = Singleton.get_state()  # Hydra's config singleton, as the other tests find it
    sweep_dir = tmp_path_factory.mktemp("sweep")
    loader = ConfigLoaderImpl(config_search_path=create_config_search_path(None))
    overrides = ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "hydra.job.chdir=false"]
    cfg = loader.load_configuration(
        None, [*overrides, f"hydra.sweep.dir={sweep_dir}"], RunMode.MULTIRUN
    )
    HydraConfig.instance().set_config(cfg)
    context = HydraContext(config_loader=loader, callbacks=Callbacks(cfg))
    yield Plugins.instance().instantiate_launcher(
        hydra_context=context, task_function=probe, config=cfg
    )
    executor = reusable_executor._executor
    if executor is not None:
        executor.shutdown(wait=True, kill_workers=True)
    Singleton.set_state(before)


def test_every_joblib_worker_imports_torch_before_the_jobs_that_then_run_there(joblib_launcher):
    said = warming.warm(joblib_launcher, modules=("torch",))
    warmed = {pid for pid, torch in said if torch}
    assert len(warmed) == 2, said  # both processes, not one twice
    jobs = joblib_launcher.launch([[], [], []], initial_job_idx=0)
    ran = [job.return_value for job in jobs]
    # the launcher's own Parallel got the executor the warm-up used: the same processes,
    # torch imported there before each job started
    assert {pid for pid, _ in ran} <= warmed, (ran, said)
    assert all(torch for _, torch in ran), ran


def test_a_warmed_process_leaves_its_imports_out_of_the_collection_after_each_job(
    joblib_launcher, monkeypatch
):
    """loky collects a worker's garbage after each job; what the warm-up imported (torch's
    objects) is frozen out of it, in every process the jobs run in."""
    from tests.job_probe import frozen

    said = warming.warm(joblib_launcher, modules=("torch",))
    monkeypatch.setattr(joblib_launcher, "task_function", frozen)
    jobs = joblib_launcher.launch([[], []], initial_job_idx=10)
    ran = dict(job.return_value for job in jobs)
    assert set(ran) <= {pid for pid, _ in said}, (ran, said)
    assert all(count > 10_000 for count in ran.values()), ran  # torch alone: tens of thousands
    # warmed again (after a speed stage): what the jobs left is not frozen, only the imports
    warming.warm(joblib_launcher, modules=("torch",))
    again = dict(job.return_value for job in joblib_launcher.launch([[], []], initial_job_idx=12))
    assert all(again[pid] == ran[pid] for pid in set(again) & set(ran)), (ran, again)


def test_what_a_warm_up_froze_is_collected_at_exit_as_without_it():
    """The interpreter's last collection still sees the frozen objects: their finalizers run
    (torch's bindings otherwise print leak warnings as each worker process exits)."""
    script = textwrap.dedent(
        """
        from tuneup.optuna.warm import keep_out_of_collections

        class Node:
            def __del__(self):
                print("finalized", flush=True)

        node = Node()
        node.me = node  # a cycle: only a collection frees it
        keep_out_of_collections()
        keep_out_of_collections()  # a second warm-up
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert (done.returncode, done.stdout) == (0, "finalized\n"), done.stderr


def test_a_job_in_a_joblib_worker_starts_dataloader_workers(joblib_launcher, monkeypatch):
    """joblib's loky workers make ``loky`` their default start method; a run there
    (a study trial, the speed stage's ``dataloader=workers``) starts its DataLoader's worker
    processes with the standard library's instead of failing."""
    from tests.job_probe import loader

    monkeypatch.setattr(joblib_launcher, "task_function", loader)
    jobs = joblib_launcher.launch([[]], initial_job_idx=20)
    assert jobs[0].return_value == [[0, 1], [2, 3]]


def test_a_failed_warm_up_is_logged_and_the_jobs_still_run(joblib_launcher, caplog):
    with caplog.at_level(logging.WARNING, logger=warming.__name__):
        assert warming.warm(joblib_launcher, modules=("tuneup_no_such_module",)) == []
    lines = [r.getMessage() for r in caplog.records if "could not be warmed" in r.getMessage()]
    assert len(lines) == 2, caplog.text  # each process says so; none raises
    assert (
        "(ModuleNotFoundError: No module named 'tuneup_no_such_module'); its first trial"
        in (lines[0])
    )
    [job] = joblib_launcher.launch([[]], initial_job_idx=5)
    assert job.return_value[0] > 0


def test_nothing_to_warm_outside_joblib_processes_or_with_one_worker(monkeypatch):
    from hydra._internal.core_plugins.basic_launcher import BasicLauncher
    from hydra_plugins.hydra_joblib_launcher.joblib_launcher import JoblibLauncher

    from tuneup.autotune.study.start import StudyStart
    from tuneup.autotune.study.workers import Workers

    assert warming.warm(BasicLauncher()) == []  # its jobs run in the sweep's process
    assert warming.warm(JoblibLauncher(n_jobs=1)) == []  # joblib runs n_jobs=1 in it too
    assert warming.warm(SimpleNamespace(joblib={"n_jobs": 2})) == []  # not joblib's launcher
    calls = []
    monkeypatch.setattr(warming, "warm", lambda launcher, config: calls.append(launcher))
    study = StudyStart()
    study.lab = SimpleNamespace(launcher="the launcher")
    study.workers = Workers(1, False, 2)
    study.warm_workers({})  # one worker: the study as without workers
    assert calls == []
    study.workers = Workers(2, False, 2)
    study.warm_workers({})
    assert calls == ["the launcher"]
    # after a speed stage without a recipe, the study's workers warmed again: the speed
    # stage's serial trials may have left a process idle past joblib's timeout
    study.user_config, study.lab.trials, study.lab.alone = {}, [], ([], "")
    study.after_speed(SimpleNamespace(launcher="the speed stage's launcher", trials=[]), None, ())
    assert calls == ["the launcher", "the speed stage's launcher"]
