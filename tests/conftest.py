"""Shared fixtures: compose configs like run.py does, run in-process or as the user's command."""

from __future__ import annotations

import gc
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

import tuneup
from tests import compositions, lane, parsed_configs, rewritten

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"

parsed_configs.install()  # each config file parsed once per test process

# No cyclic garbage collection while the process imports (torch, Lightning, the test modules):
# each collection walks everything imported so far, 1.1 CPU-s of a worker's collection of the
# suite (8 instead of 7). On again once the collection ends (pytest_collection_finish), or in
# the xdist controller, which collects nothing, once it has configured (pytest_configure).
gc.disable()

#: Overrides that make a run take a second or two on a CPU: small data, small model, one epoch.
TINY = [
    "data.train_samples=256",
    "data.val_samples=128",
    "data.batch_size=32",
    "model.width=8",
    "trainer.max_epochs=1",
    "trainer.enable_progress_bar=false",
    "trainer.log_every_n_steps=1",
]
#: Tiny runs of the built-in synthetic images see them at 16 pixels a side (32 by default): the
#: same steps and samples for a third less CPU a run (small_resnet's convolutions).
TINY_IMAGES = "data.image_size=16"


def tiny_gpt(epochs: int, batch_size: int | None = None) -> list[str]:
    """model=gpt at its smallest (2 layers of width 16, 4 heads) on 32 synthetic sequences of 8
    tokens, 64 of them, for ``epochs`` epochs (``data.batch_size``, when given): what the
    distributed tests train, on one process and on a mesh."""
    return [
        "model=gpt",
        "model.layers=2",
        "model.width=16",
        "model.heads=4",
        "data=synthetic_tokens",
        "data.context=8",
        "data.train_samples=32",
        "data.val_samples=16",
        "data.vocab_size=64",
        *([] if batch_size is None else [f"data.batch_size={batch_size}"]),
        f"trainer.max_epochs={epochs}",
    ]


def tiny_overrides(overrides) -> list[str]:
    """TINY, and TINY_IMAGES unless the overrides choose other data or an image size."""
    other = any(
        a.startswith(("data=", "+data=", "data.image_size=")) and a != "data=synthetic_images"
        for a in overrides
    )
    return [*TINY, *([] if other else [TINY_IMAGES])]


def compose_config(overrides=(), tiny=True, config_dir=None):
    """The config run.py would get for these command-line overrides; for the built-in config
    folder, memoised per process and each set of config groups composed once
    (tests/compositions.py): a test gets its own copy, which it may change."""
    args = [*(tiny_overrides(overrides) if tiny else []), *overrides]
    if config_dir is not None:
        return tuneup.compose(args, config_dir=config_dir)
    return compositions.compose(args)


@pytest.fixture(autouse=True)
def _environment_as_before():
    """Each test leaves ``os.environ`` as it found it. An in-process DDP run leaves Lightning's
    ``MASTER_PORT``, ``LOCAL_RANK``, ``WORLD_SIZE``... behind (tuneup undoes them when the next
    run in the process launches); a later test's subprocess must not inherit them."""
    saved = dict(os.environ)
    yield
    if os.environ != saved:
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture(autouse=True)
def _root_logging_as_before():
    """Each test leaves the root logger's handlers and level as it found them (pytest's own
    capture handlers aside). A sweep run in-process configures Hydra's logging, a
    StreamHandler on the root logger writing to that test's captured stream; a later test's
    run then said what it says through it (trainer/console.py ``say``), not on its stdout."""
    root = logging.getLogger()
    handlers, level = set(root.handlers), root.level
    yield
    for handler in root.handlers[:]:
        if handler not in handlers and type(handler).__module__ != "_pytest.logging":
            root.removeHandler(handler)
    root.setLevel(level)


@pytest.fixture
def make_config():
    return compose_config


@pytest.fixture
def train(tmp_path):
    """Run a tiny training in this process; returns (summary dict, run dir)."""

    def _train(*overrides, tiny=True, run_dir=None):
        cfg = compose_config(overrides, tiny=tiny)
        out = Path(run_dir or tmp_path / "run")
        tuneup.run(cfg, run_dir=out)
        return json.loads((out / "summary.json").read_text()), out

    return _train


_zygote: dict = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """A test marked ``cold`` starts its commands as users do, from a fresh interpreter, in its
    setup (module fixtures it is the first to use) as in its body. Set per process: each
    pytest-xdist worker runs its own tests' protocols."""
    lane.cold = item.get_closest_marker("cold") is not None
    try:
        yield
    finally:
        lane.cold = False


def python() -> list[str]:
    """The command that starts ``python``: a warm start through the session's zygote
    (tests/warm.py: torch and Lightning imported once, a fork per command), or
    ``[sys.executable]`` in a test marked ``cold`` and in every test under
    ``TUNEUP_TEST_COLD=1``. Under pytest-xdist the controller starts one zygote for all
    workers (:func:`pytest_configure`); in one process, the first use starts it."""
    if lane.cold or os.environ.get("TUNEUP_TEST_COLD"):
        return [sys.executable]
    if not _zygote:
        folder = os.environ.get(ZYGOTE_VARIABLE)
        _zygote.update(start_zygote() if folder is None else {"folder": Path(folder)})
    return wait_for_zygote(Path(_zygote["folder"]))


def start_zygote(env: dict | None = None) -> dict:
    """A zygote serving from a fresh folder (its socket, and ``python``: the script that runs
    the client, ``sys.executable`` in the children); ended with this process."""
    import atexit
    import shlex
    import shutil
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="tuneup-zygote-"))
    client = " ".join(map(shlex.quote, client_command(folder)))
    (folder / "python").write_text(f'#!/bin/sh\nexec {client} "$@"\n')
    (folder / "python").chmod(0o755)
    server = subprocess.Popen(
        [sys.executable, str(WARM), "serve", str(folder / "socket"), str(folder / "python")],
        stdin=subprocess.DEVNULL,
        env=env,
    )
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    atexit.register(server.terminate)
    return {"folder": folder, "server": server}


def wait_for_zygote(folder: Path, timeout: float = 300) -> list[str]:
    """The client command, once the zygote's socket is there (it binds after its imports)."""
    import time

    deadline = time.monotonic() + timeout
    while not (folder / "socket").exists():
        server = _zygote.get("server")
        if (server and server.poll() is not None) or time.monotonic() > deadline:
            raise RuntimeError(f"the test zygote ({WARM}) did not start in {folder}")
        time.sleep(0.05)
    return client_command(folder)


def client_command(folder: Path) -> list[str]:
    """``python`` through the zygote serving in ``folder``."""
    return [sys.executable, str(WARM), str(folder / "socket")]


#: Where the controller's zygote serves, for the xdist workers.
ZYGOTE_VARIABLE = "TUNEUP_TEST_ZYGOTE"
WARM = Path(__file__).resolve().parent / "warm.py"


def bench_module(name: str):
    """``bench/<name>.py`` imported as a module (the bench scripts are not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_cli(*args, cwd=None, env=None, timeout=300, tiny=True):
    """Run ``python run.py ARGS`` as a user would; returns the CompletedProcess."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    command = [*python(), str(ROOT / "run.py"), *(tiny_overrides(args) if tiny else []), *args]
    return subprocess.run(
        command, cwd=cwd or ROOT, env=full_env, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture
def cli(tmp_path):
    """``cli(*args)`` runs run.py with its run directory in tmp_path/run."""

    def _cli(*args, run_dir=None, **kwargs):
        out = run_dir or tmp_path / "run"
        return run_cli(f"hydra.run.dir={out}", *args, **kwargs)

    return _cli


def register_in_runs(patch, plugins: list) -> None:
    """In-process runs started while ``patch`` (a pytest MonkeyPatch) holds also register
    ``plugins`` (a spy, a probe), besides their config's; the list may grow meanwhile."""
    from tuneup.trainer import runner
    from tuneup.trainer.plugin_manager import PluginManager

    class WithExtra(PluginManager):
        @classmethod
        def from_config(cls, cfg):
            pm = super().from_config(cfg)
            for i, plugin in enumerate(plugins):
                pm.register(plugin, name=f"test-extra-{i}")
            return pm

    patch.setattr(runner, "PluginManager", WithExtra)


@pytest.fixture
def add_plugin(monkeypatch):
    """``add_plugin(obj)``: in-process runs started in this test also register ``obj`` as a plugin.

    Returns ``obj``, so a test keeps a handle on the probe it added.
    """
    extra = []
    register_in_runs(monkeypatch, extra)

    def _add(plugin):
        extra.append(plugin)
        return plugin

    return _add


# --- GPU tests ------------------------------------------------------------------------------

#: Why a test marked ``gpu`` did not run here (pytest -ra prints it).
NO_CUDA = (
    "needs a CUDA GPU (torch.cuda.is_available() is False here); bench/gpu.sh runs the gpu "
    "tests on a GPU machine"
)


#: The files whose tests take longest (real clusters, kills and resumes, several processes),
#: longest first (their worker-seconds under ``-n 2``, pytest --durations=0): collected first, so
#: that under pytest-xdist (``-n 2 --dist loadfile`` in pyproject.toml; files handed out in
#: collection order: :func:`pytest_configure`) they start first and the run does not end with
#: one of them alone on one worker. Not test_triton_kernels.py: its interpreted runs start with
#: the session, in the background (:func:`start_interpreted_runs`), and the later it reads
#: their results the less it waits.
LONGEST_FIRST = (
    "test_model_parallel.py",
    "test_slurm.py",
    "test_ddp.py",
    "test_autotune.py",
    "test_docs_commands.py",
    "test_own_project.py",
    "test_optuna.py",
    "test_run.py",
    "test_autotune_stages.py",
    "test_shards.py",
    "test_compile.py",
    "test_sweeps.py",
    "test_autotune_study.py",
    "test_ema.py",
    "test_huggingface.py",
    "test_resume.py",
    "test_bench.py",
    "test_logger_mlflow.py",
    "test_run_dirs.py",
    "test_console_noise.py",
    "test_newcomer.py",
    "test_async_checkpoint.py",
    "test_sweep_presets.py",
    "test_activation_checkpointing.py",
    "test_pretrained.py",
    "test_augment.py",
    "test_postgres.py",
    "test_data_path.py",
    "test_kernel_plugins.py",
    "test_multinode.py",
    "test_installed.py",
    "test_precision.py",
    "test_resume_every_checkpoint.py",
    "test_micro_batch.py",
    "test_warm.py",
    "test_docs_finetune.py",
    "test_models.py",
    "test_config_errors.py",
    "test_memory_format.py",
    "test_study_warm_workers.py",
    "test_docs_example.py",
    "test_grad_accum.py",
    "test_fp8.py",
    "test_preemption_hint.py",
)


def pytest_configure(config):
    """An xdist worker gets its share of the cores for torch's threads, and so do the runs it
    starts (they inherit ``OMP_NUM_THREADS``): two workers with a thread per core each on two
    cores spin against each other, and every run takes several times as long. A value set in
    the shell is kept. The controller starts the workers' zygote (:func:`python`)."""
    worker = hasattr(config, "workerinput")
    xdist = getattr(config.option, "numprocesses", None)
    workers = config.workerinput["workercount"] if worker else xdist
    share = thread_share(workers)
    if worker:
        os.environ.update(share)
    elif workers and not os.environ.get("TUNEUP_TEST_COLD") and ZYGOTE_VARIABLE not in os.environ:
        # one for all workers (they inherit the variable), importing with their thread share
        _zygote.update(start_zygote({**os.environ, **share}))
        os.environ[ZYGOTE_VARIABLE] = str(_zygote["folder"])
    if not worker:
        tmp_in_memory()
        compile_sources()
        if workers:  # each worker collects every file: rewritten once, here (tests/rewritten.py)
            here = Path(config.invocation_params.dir)
            rewritten.write([here / a.split("::")[0] for a in config.args], config)
        # pytest-xdist hands out files largest *count of tests* first unless told not to:
        # the files of three long tests (a Slurm cluster, the Triton interpreter) came last
        # and one worker ended alone; LONGEST_FIRST's order is the order they are handed out
        if getattr(config.option, "dist", "no") in ("loadfile", "loadscope"):
            config.option.loadscopereorder = False
        start_interpreted_runs(config)
        if workers:  # the controller: its workers collect, not it
            gc.enable()


#: Where the tests' temporary folders go when the machine has it (a tmpfs: memory, not disk).
TMPFS = Path("/dev/shm")


def tmp_in_memory() -> None:
    """The tests' ``tmp_path`` folders (pytest's ``pytest-of-USER/pytest-N``, the last three
    kept) in memory: on these machines' disk each checkpoint a test saves is fsynced
    (trainer/state/checkpoint_write.py), some 300 MB in a suite, and the suite stood 85 s of
    its 6 minutes with every process waiting on the disk (/proc/pressure/io, a checkout's run),
    37 s and 5.5 s in two runs with its folders on /dev/shm. Not where the shell chose a root
    (``PYTEST_DEBUG_TEMPROOT``, pytest's own variable) or there is no tmpfs with 4 GB free."""
    import shutil

    if "PYTEST_DEBUG_TEMPROOT" in os.environ or not TMPFS.is_dir():
        return
    if not os.access(TMPFS, os.W_OK) or shutil.disk_usage(TMPFS).free < 4 * 2**30:
        return
    os.environ["PYTEST_DEBUG_TEMPROOT"] = str(TMPFS)  # xdist's workers get their basetemp in it


#: The checkout's folders of Python that the tests' processes import from source.
SOURCES = ("tuneup", "trainer", "plugins", "zoo", "hydra_plugins", "tests", "bench")


def compile_sources() -> None:
    """Bytecode for the checkout's Python, written before any test process starts. Each of the
    suite's ~250 processes (workers, the zygote's children, DDP ranks, sweep jobs) imports
    tuneup from source; where ``PYTHONDONTWRITEBYTECODE=1`` is set (this project's machines)
    nothing writes bytecode, so in a clean clone each process compiled tuneup again: 0.3-0.4
    CPU-seconds a run, 7 % of the suite. compileall writes it regardless, once; an up-to-date
    file is a ``stat``."""
    import compileall

    for folder in SOURCES:
        compileall.compile_dir(ROOT / folder, quiet=2)


def start_interpreted_runs(config) -> None:
    """Where tests/kernels/test_triton_kernels.py will run: its Triton-interpreter test runs
    (and the oldest supported Triton's download, 700 MB) start now, in the background, at the
    lowest priority (tests/kernels/interpreted_runs.py): they take the CPU the workers leave
    idle, and the test reads their results from the folder in :data:`FOLDER_VARIABLE`."""
    import atexit
    import importlib.metadata
    import shutil
    import tempfile

    from tests.kernels import interpreted_runs, oldest_triton

    cache = getattr(config, "cache", None)
    if cache is None or config.option.collectonly:
        return
    here = Path(config.invocation_params.dir)
    wanted = interpreted_runs.TEST_FILE
    args = [(here / arg.split("::")[0]).resolve() for arg in config.args]
    if not any(a == wanted or a in wanted.parents for a in args):
        return
    try:
        version = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:  # the test file says so itself
        return
    folder = Path(tempfile.mkdtemp(prefix="tuneup-interpreted-"))
    running = interpreted_runs.start_in_background(folder, oldest_triton.cache_dir(cache), version)
    os.environ[interpreted_runs.FOLDER_VARIABLE] = str(folder)  # the workers inherit it
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    # a session that ends first stops them (and pip: the group)
    atexit.register(lambda: running.poll() is None and os.killpg(running.pid, 9))


def thread_share(workers) -> dict:
    """``OMP_NUM_THREADS`` for each of ``workers`` xdist workers, unless the shell set it."""
    if "OMP_NUM_THREADS" in os.environ or not str(workers).isdigit() or not int(workers):
        return {}
    from tuneup.trainer.environment import cpus_per_process

    return {"OMP_NUM_THREADS": str(cpus_per_process(int(workers)))}


def pytest_collection_modifyitems(config, items):
    """The longest files first (:data:`LONGEST_FIRST`); tests marked ``gpu`` run where CUDA is
    present and are skipped, saying why, where not."""
    import torch

    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: file order kept
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason=NO_CUDA)
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


def pytest_collection_finish(session):
    """What the collection made (torch, Lightning, the test modules: 620 thousand objects)
    goes to the collector's permanent generation, as the zygote's imports do (tests/warm.py):
    a worker's full collections walk what its tests make, not those. On 126 in-process tests:
    full collections took 1.8-2.0 CPU-s in all instead of 2.4 (23 cheap ones, not 11 dear);
    pytest's five collections at the session's end (its unraisable-exception plugin) 0.65
    CPU-s less. Unfrozen when the interpreter ends, for its last collection (Triton's bindings
    list what is left then as "leaked")."""
    import atexit

    gc.collect()
    gc.freeze()
    gc.enable()  # off since this module was imported
    atexit.register(gc.unfreeze)


@pytest.fixture
def cuda_peak():
    """The dense 16-bit peak (TFLOP/s) of this GPU from trainer/flops.py; skips if unknown."""
    import torch

    from tuneup.trainer.flops import peak_tflops

    name = torch.cuda.get_device_name()
    peak = peak_tflops(name)
    if peak is None:
        pytest.skip(f"no known peak for {name!r} in trainer/flops.py PEAK_TFLOPS")
    return peak
