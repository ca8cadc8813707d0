"""Run one training job from a composed config: the data flow of DESIGN.md.

load plugins -> plan what is trained (components.Plan) -> check (all problems at once) ->
resume= resolved -> build data, model -> configure_model pipeline -> configure_trainer ->
fit (from the checkpoint) -> report -> summary.json

Here: the run's course (its directory, checks, resume, the fit or the evaluation, a failure's
status). What it trains with is built in build.py; what it reports at the start and the end,
summary.json included, is run_report.py's.
"""

from __future__ import annotations

import logging
import time
from contextlib import nullcontext, suppress
from pathlib import Path

from tuneup.errors import TuneupError
from tuneup.trainer import console
from tuneup.trainer import summary as run_summary
from tuneup.trainer.build import build
from tuneup.trainer.checks import core_problems, mode_problems
from tuneup.trainer.components import Plan
from tuneup.trainer.empty_init import wanted
from tuneup.trainer.environment import Environment, standard_start_method, threads_as_asked
from tuneup.trainer.evaluate import evaluate
from tuneup.trainer.plugin_listing import listing
from tuneup.trainer.plugin_manager import PluginManager
from tuneup.trainer.run_report import finish, plan_line, sweep_job
from tuneup.trainer.state.preemption import (
    Interrupted,
    Preempted,
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
            finish(cfg, plugins, trainer, summary, run_dir)
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


def _needs_final_validation(trainer, run_state: RunState) -> bool:
    """Lightning validates at epoch ends; a run stopped by max_steps mid-epoch (a sweep's
    fixed budget) would report the metrics of an older step, or none."""
    if trainer.interrupted or (trainer.should_stop and trainer.global_step < trainer.max_steps):
        return False
    limit = trainer.limit_val_batches
    return bool(limit) and run_state.validated_at_step != trainer.global_step
