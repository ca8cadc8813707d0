"""Build and run one training job from a composed config: the data flow of DESIGN.md.

load plugins -> plan what is trained (components.Plan) -> check (all problems at once) ->
resume= resolved -> build data, model -> configure_model pipeline -> configure_trainer ->
fit (from the checkpoint) -> report -> summary.json
"""

from __future__ import annotations

import logging
import os
import platform
import sys
import time
from contextlib import nullcontext, suppress
from pathlib import Path

import pytorch_lightning as pl

from tuneup.errors import TuneupError
from tuneup.trainer import callbacks, console, openmp
from tuneup.trainer import summary as run_summary
from tuneup.trainer.bridge import Bridge
from tuneup.trainer.checks import core_problems, mode_problems
from tuneup.trainer.components import Plan
from tuneup.trainer.empty_init import empty_parameters, wanted
from tuneup.trainer.environment import Environment, standard_start_method, threads_as_asked
from tuneup.trainer.evaluate import evaluate
from tuneup.trainer.module import TrainingModule, with_batch_transforms
from tuneup.trainer.plugin_listing import listing
from tuneup.trainer.plugin_manager import PluginManager
from tuneup.trainer.state.data_order import dropped_per_epoch
from tuneup.trainer.state.preemption import (
    Interrupted,
    Preempted,
    command_name,
    continue_command,
)
from tuneup.trainer.state.progress import shortfall
from tuneup.trainer.state.resume import (
    check_config,
    checkpoint_dir,
    complete,
    load_weights,
    resolve,
    weights_only_setting,
)
from tuneup.trainer.state.run_dir import Claim, RunDirLock, check_writable, holds_a_run
from tuneup.trainer.state.run_state import RunState

log = logging.getLogger(__name__)


class ConfigError(TuneupError):
    """The config or the machine cannot run: every problem found, one per line."""

    def __init__(self, found: list[str]) -> None:
        self.problems = found
        super().__init__(
            f"{len(found)} problem(s) with this run's config:\n"
            + "\n".join(f"  - {p}" for p in found)
        )


def run_dir_from_hydra() -> Path:
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized():
        return Path(HydraConfig.get().runtime.output_dir)
    return Path.cwd()


def run(cfg, run_dir: str | Path | None = None):
    """Train as ``cfg`` says, write ``summary.json`` into ``run_dir``; return the final val acc.

    Without ``run_dir`` the Hydra run directory (``hydra.run.dir``) is used.
    Returns None for ``plugins.list=true``, which prints the plugins and exits.

    The run first takes its directory (state/run_dir.py: an exclusive lock) and resolves
    ``resume=``; a run refused there (the directory is another live run's, or holds a
    finished run and resume=null) raises without touching anything in it. Then the run takes
    the directory (state/run_dir.py ``Claim``): its record (.hydra/), its log file and its
    summary, written also when it fails. A directory that holds a run is taken only once
    training starts: a resume refused before then (its settings, its checkpoint, a plugin's
    check) raises and leaves that run as it was, for its own command to continue.
    """
    if cfg.get("plugins", {}).get("list", False):
        print(listing(PluginManager.from_config(cfg), cfg))
        if run_dir is None:
            _remove_if_empty(run_dir_from_hydra())  # made by Hydra, and nothing was run there
        return None
    threads_as_asked()
    standard_start_method()
    run_dir = Path(run_dir) if run_dir is not None else run_dir_from_hydra()
    first = console.process_rank() == "0"  # the other ranks join the directory it holds
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TuneupError(
            f"cannot create the run directory {run_dir}: {exc.strerror}; give "
            "one where you can write: hydra.run.dir=<directory>"
        ) from exc
    if found := mode_problems(cfg):  # before resume= is resolved: it names what is missing
        raise ConfigError(found)
    weights_only = weights_only_setting(cfg) or cfg.get("mode", "fit") != "fit"  # weights only
    resume_from = resolve(cfg.get("resume"), run_dir, weights_only)  # refused: untouched
    done = None if resume_from is None or weights_only else complete(cfg, run_dir, *resume_from)
    if done:
        console.say(done, log)  # a finished run resumed as it was: untouched too
        return _previous_acc(run_dir)
    held = holds_a_run(run_dir)  # another run's files: they change only once training starts
    check_writable(run_dir, checkpoint_dir(run_dir))  # now, not at the first save
    lock = RunDirLock(run_dir) if first else nullcontext()
    with lock, console.log_file(run_dir, held) as run_log:
        claim = Claim(run_dir, cfg, run_log, first, held)
        try:
            return _train(cfg, run_dir, resume_from, weights_only, claim)
        except BaseException as exc:
            if claim.taken:  # else refused: the error goes to the console alone
                console.traceback_to_file(log, exc)
                _note(exc, tuneup_log=run_dir / console.log_file_name())  # the command names it
            raise


def _previous_acc(run_dir: Path):
    """The final val acc in the summary a finished run left, if it left one."""
    try:
        return run_summary.read(run_dir).get("val", {}).get("acc")
    except (OSError, ValueError, AttributeError):
        return None


def _train(cfg, run_dir: Path, resume_from, weights_only: bool, claim: Claim):
    """Check, build, fit and report; the run takes its directory (``claim``) as training
    starts (RunState), or before its checkpoint's weights are evaluated (``mode``)."""
    summary: dict = {"status": "running", "run_dir": str(run_dir)}
    plugins = trainer = run_state = ckpt_path = None
    try:
        plugins = PluginManager.from_config(cfg)
        env = Environment.from_config(cfg)
        plan = Plan(cfg, plugins)
        found = core_problems(cfg, env, plan)
        found += plugins.check(cfg, env, plan)
        if found:
            raise ConfigError(found)
        if console.process_rank() == "0" and sweep_job() is None:  # once per run; a sweep's
            console.say(plan_line(plan, env, run_dir), log)  # jobs: one line each, at the end
        summary.update(device=env.device_name, accelerator=env.accelerator)
        empty = wanted(cfg, resume_from is not None and weights_only) and not plan.lightning
        trainer, module, data, run_state = build(cfg, plugins, plan, run_dir, empty)
        claim.when_accepted = lambda: plugins.call(
            "on_run_accepted", cfg=cfg, trainer=trainer, module=module
        )
        run_state.on_start = claim.accept
        ckpt_path = None
        if resume_from is not None:
            path, checkpoint = resume_from
            if weights_only:  # a new run from the weights: Lightning's ckpt_path restores all
                load_weights(path, checkpoint, module, cfg.get("mode", "fit"))
                summary["resumed_weights_only"] = True
            else:
                check_config(
                    path, checkpoint, cfg, trainer, module, owns_optimizer=not plan.lightning
                )
                ckpt_path = path
            summary["resumed_from"] = str(path)  # not claimed when refused (above, or in fit)
            resume_from = checkpoint = None  # Lightning loads it again, into the model
        started = time.perf_counter()
        mode = cfg.get("mode", "fit")
        if mode == "fit":
            trainer.fit(module, datamodule=data, ckpt_path=ckpt_path, weights_only=True)
            claim.accept()  # a fit that had nothing to train never started training: it ended
            if _needs_final_validation(trainer, run_state):
                trainer.validate(module, datamodule=data, verbose=False)
        else:  # the checkpoint's weights, evaluated or predicted with; nothing trained
            claim.accept()
            summary["mode"] = mode
            summary.update(evaluate(mode, trainer, module, data, run_dir))
        summary["status"] = "ok"
        if ckpt_path is not None and (short := shortfall(trainer, run_state.started_at)):
            summary["short_of_limits"] = short  # a resumed run never ends short without a word
        summary["fit_seconds"] = time.perf_counter() - started
    except BaseException as exc:
        failure = _as_interruption(exc, trainer, run_dir)
        if ckpt_path is not None and run_state is not None and not run_state.restored:
            summary.pop("resumed_from", None)  # refused as training started: nothing resumed
        summary["status"] = _status(failure, trainer)
        summary["error"] = f"{type(failure).__name__}: {failure}".strip()
        if trainer is not None and trainer.world_size > 1:
            failure.tuneup_rank = trainer.global_rank  # the command names the process that failed
        if trainer is not None:
            _note(failure, tuneup_step=trainer.global_step)  # and the step it failed at
        if failure is exc:
            raise
        raise failure from exc
    finally:
        first = console.process_rank() == "0" if trainer is None else trainer.is_global_zero
        if first and claim.taken:  # one summary per run, by its first process
            _finish(cfg, plugins, trainer, summary, run_dir)
    return summary.get("val", {}).get("acc")


def _remove_if_empty(run_dir: Path) -> None:
    """Remove ``run_dir`` and its parents below the current directory while they are empty
    (``outputs/<date>/<time>``, which Hydra makes before the job runs)."""
    here, folder = Path.cwd().resolve(), run_dir.resolve()
    while folder != here and here in folder.parents:
        try:
            folder.rmdir()  # only an empty one
        except OSError:
            return
        folder = folder.parent


def _note(exc: BaseException, **facts) -> None:
    """Attach what the command's one-line error says (tuneup/cli.py) to the exception."""
    for key, value in facts.items():
        with suppress(AttributeError):  # an exception type without a __dict__
            setattr(exc, key, value)


def _as_interruption(exc: BaseException, trainer, run_dir: Path) -> BaseException:
    """Ctrl-C that no checkpoint was saved for (pressed twice, before training, or with
    checkpoint=off; Lightning turns it into SystemExit(1)) as :class:`Interrupted`: exit 130
    and the command that continues from the last checkpoint there is. Else ``exc`` itself."""
    if isinstance(exc, Preempted):
        return exc
    lightning = trainer is not None and trainer.interrupted and isinstance(exc, SystemExit)
    if not (lightning or isinstance(exc, KeyboardInterrupt)):
        return exc
    step = trainer.global_step if trainer is not None else 0
    return Interrupted(
        f"Ctrl-C: stopped at step {step} without saving; continue from the last "
        f"checkpoint (if any) with: {continue_command(run_dir)}"
    )


def _status(exc: BaseException, trainer) -> str:
    """preempted, interrupted (Ctrl-C), or failed."""
    if isinstance(exc, Interrupted):
        return "interrupted"
    return "preempted" if isinstance(exc, Preempted) else "failed"


def plan_line(plan: Plan, env: Environment, run_dir: Path) -> str:
    """The run in one line, before it starts: what trains on what, where, into which directory."""
    choices = [
        f"{g}={plan.cfg[g].get('name')}"
        for g in ("precision", "memory_format", "strategy")
        if plan.cfg.get(g) is not None
    ]
    return (
        f"tuneup: {plan.model_name} on {plan.data_name}, {', '.join(choices)}; "
        f"{env.device_name}; run directory {run_dir}"
    )


def _needs_final_validation(trainer, run_state: RunState) -> bool:
    """Lightning validates at epoch ends; a run stopped by max_steps mid-epoch (a sweep's
    fixed budget) would report the metrics of an older step, or none."""
    if trainer.interrupted or (trainer.should_stop and trainer.global_step < trainer.max_steps):
        return False
    limit = trainer.limit_val_batches
    return bool(limit) and run_state.validated_at_step != trainer.global_step


def build(cfg, plugins: PluginManager, plan: Plan, run_dir: Path, empty: bool = False):
    """Seed, build data and model, let plugins transform them, and create the Trainer.

    ``empty``: the model's parameters on the meta device (trainer/empty_init.py); the strategy
    materialises and initialises them once sharded (``strategy.init``).
    Returns (trainer, the LightningModule, the data module, the run-state callback).
    """
    data = plan.data
    pl.seed_everything(cfg.seed, workers=True, verbose=False)  # the model's initial weights
    with empty_parameters() if empty else nullcontext():
        model = plan.build_model()
    model = plugins.pipeline("configure_model", "model", model, cfg=cfg)
    run_state = RunState(cfg, watches_outputs=plan.lightning, owns_optimizer=not plan.lightning)
    if not plan.lightning:
        model = TrainingModule(cfg, model, plugins, plan.task, run_state)
    # the pipeline only where a plugin transforms batches: an overridden on_after_batch_transfer
    # costs Lightning's dispatch (and a warning-cache lookup) on every batch
    module = with_batch_transforms(model, plugins, cfg)
    kwargs = trainer_kwargs(cfg, plugins, run_dir)
    plugins.call("configure_trainer", cfg=cfg, kwargs=kwargs)
    kwargs["callbacks"].append(run_state)  # after the plugins' callbacks: it restores the RNG
    return pl.Trainer(**kwargs), module, data, run_state


def trainer_kwargs(cfg, plugins: PluginManager, run_dir: Path) -> dict:
    from omegaconf import OmegaConf

    kwargs = OmegaConf.to_container(cfg.trainer, resolve=True)
    kwargs["default_root_dir"] = str(run_dir)
    if kwargs.get("enable_progress_bar") == "auto":  # a bar where someone watches it, not in logs
        kwargs["enable_progress_bar"] = sys.stderr.isatty()
    kwargs["callbacks"] = [Bridge(cfg, plugins), *callbacks.build(cfg)]  # the user's: config
    if kwargs.get("log_every_n_steps") is None:  # null: fitted to the run once its length is known
        kwargs["log_every_n_steps"] = 1  # until then: no "smaller than the logging interval"
        kwargs["callbacks"].append(LogInterval())
    # The data module's sampler shards each epoch by rank itself (state/data_order.py): Lightning must
    # not wrap it in a DistributedSampler, which would shard the shard again.
    kwargs["use_distributed_sampler"] = False
    return kwargs


class LogInterval(pl.Callback):
    """``trainer.log_every_n_steps=null``: every 20 optimizer steps, fewer in a short run (at
    least about 10 points in metrics.csv) or a short epoch (Lightning would warn that the
    epoch is shorter than the interval). Set when training starts: the epoch's length is
    known only once Lightning has made the training DataLoader."""

    def on_train_start(self, trainer, pl_module) -> None:
        trainer.log_every_n_steps = log_interval(
            trainer.num_training_batches,
            trainer.accumulate_grad_batches,
            trainer.max_steps,
            trainer.max_epochs,
        )
        # Its one event is done: out of the list, Lightning does not dispatch its hooks each
        # step to it (bench/overhead.py). A new list: the one being iterated now stays as it is.
        trainer.callbacks = [c for c in trainer.callbacks if c is not self]


def log_interval(batches, accumulate: int, max_steps: int, max_epochs, most: int = 20) -> int:
    """Optimizer steps between logged points: at most ``most``, at most an epoch's steps, and
    a tenth of the run's steps where it is short."""
    per_epoch = max(1, int(batches) // max(1, accumulate)) if batches != float("inf") else most
    if max_steps is not None and max_steps > 0:
        total = max_steps
    elif max_epochs is not None and max_epochs > 0:
        total = per_epoch * max_epochs
    else:
        total = most * 10
    return max(1, min(most, per_epoch, total // 10))


def _finish(cfg, plugins, trainer, summary: dict, run_dir: Path) -> None:
    """Report and write the summary, also after a failure: what was measured is kept."""
    if trainer is not None:
        summary.update(
            world_size=trainer.world_size, steps=trainer.global_step, epochs=trainer.current_epoch
        )
        dropped = dropped_per_epoch(trainer.train_dataloader)  # full batches only
        if dropped is not None:
            summary["dropped_per_epoch"] = dropped
        if isinstance(trainer.lightning_module, TrainingModule):  # measured: grad_norm
            summary.update(trainer.lightning_module.grad_norm.summary())
    summary.update(python=platform.python_version(), torch=_torch_version())
    if openmp.VARIABLE in os.environ:  # how OpenMP's threads wait here, and why
        summary["openmp_wait"] = os.environ[openmp.VARIABLE]
    if plugins is not None:
        summary["plugins"] = plugins.describe(cfg)
        # each plugin's report by itself: one failing keeps the others' figures
        failed = (
            plugins.call_each("report", cfg=cfg, summary=summary) if trainer is not None else {}
        )
        if failed:
            summary["report_errors"] = failed  # the status stays: the run itself is done
    summary["command"] = command_name()
    path = run_summary.write(summary, run_dir)
    if summary["status"] in ("ok", "pruned"):  # pruned: an Optuna trial stopped by its pruner
        job = sweep_job()
        if job is not None:  # a sweep's job: one line (the report at the end compares them)
            line = run_summary.one_line(summary, job)
            console.say(f"{line}; summary written to {path}", log)
            return
        if cfg.get("measure", {}).get("console_table", True):  # summary.json has it anyway
            console.say(run_summary.format_table(summary), log)
        console.say(f"summary written to {path}", log)


def sweep_job() -> str | None:
    """``#<job> <overrides>`` when this run is a job of a sweep (Hydra multirun), else None."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return None
    hydra = HydraConfig.get()
    return f"#{hydra.job.num} {' '.join(hydra.overrides.task)}".strip()


def _torch_version() -> str:
    import torch

    return torch.__version__
