"""Checks of the core's own config values: seed, mode, components, and the Lightning Trainer
arguments, each problem one line naming the key, the bad value and what is allowed.

Keys nothing reads (a typo added with ``+``) are unread_keys.py's; a setting of a plugin that is
off, given on the command line, is refused here. Plugins check their own groups in their
``check`` hook; the runner shows these problems and the plugins' together.
"""

from __future__ import annotations

import inspect

import torch
from omegaconf import OmegaConf

from tuneup.trainer import callbacks, unread_keys
from tuneup.trainer.optim import check_optim
from tuneup.trainer.own_optimizer import missing_hook_problems, own_settings_problems
from tuneup.trainer.typos import did_you_mean
from tuneup.trainer.validation import BOOL, Integer, Number, OneOf, problem, problems

_FRACTION_OR_COUNT = "a fraction in (0, 1] or a whole number of batches >= 0"

TRAINER_RULES = {
    "seed": Integer(low=0),
    # 0 would train nothing and end "ok": refused (-1 is "no limit", as in Lightning)
    "trainer.max_steps": Integer(low=1, also=(-1,), note="-1: no step limit"),
    "trainer.max_epochs": Integer(low=1, also=(-1, None), note="-1: no epoch limit"),
    "trainer.min_steps": Integer(low=0, also=(None,)),
    "trainer.accelerator": OneOf(("auto", "cpu", "gpu", "cuda", "mps")),
    "trainer.num_nodes": Integer(low=1),
    "trainer.log_every_n_steps": Integer(low=1, also=(None,), note="null: fitted to the run"),
    "trainer.check_val_every_n_epoch": Integer(low=1, also=(None,)),
    "trainer.num_sanity_val_steps": Integer(low=-1),
    "trainer.accumulate_grad_batches": Integer(low=1),
    "trainer.gradient_clip_val": Number(ge=0),
    # Lightning's own choices: "warn" picks deterministic kernels where torch has them and
    # warns where it has none; null leaves torch's setting alone
    "trainer.deterministic": OneOf((True, False, "warn", None)),
    "trainer.benchmark": OneOf((True, False, None)),
    "trainer.enable_progress_bar": OneOf((True, False, "auto")),
    "trainer.fast_dev_run": BOOL,
}

#: ``mode``: train, or evaluate / predict with a checkpoint's weights (Lightning's entry points).
MODES = ("fit", "validate", "test", "predict")
#: What a mode that trains nothing does with the checkpoint's weights (its errors say it).
USES = {"validate": "evaluates", "test": "evaluates", "predict": "predicts with"}


def clip_problems(cfg, plan) -> list[str]:
    """``optimizer.clip_grad_norm`` is tuneup's training step's; a user's LightningModule has
    its own (Lightning's ``trainer.gradient_clip_val`` clips there)."""
    clip = cfg.optimizer.get("clip_grad_norm")
    if clip is not None and plan.lightning:
        return [
            f"optimizer.clip_grad_norm={clip} with model=lightning: your LightningModule "
            f"trains itself; use +trainer.gradient_clip_val={clip} (Lightning's clipping)"
        ]
    return []


def mode_problems(cfg) -> list[str]:
    """``mode``: one of :data:`MODES`; one that trains nothing needs a checkpoint's weights and
    refuses what only a fit reads."""
    mode = cfg.get("mode", "fit")
    if mode not in MODES:
        meant = did_you_mean(str(mode), MODES)
        return [
            problem("mode", mode, OneOf(MODES)) + (f"; did you mean mode={meant}?" if meant else "")
        ]
    if mode == "fit":
        return []
    found = []
    if cfg.get("resume") in (None, "auto"):
        found.append(
            f"mode={mode} needs resume=<checkpoint> (a .ckpt file or a sharded "
            f"checkpoint directory): the weights it {USES[mode]}"
        )
    if cfg.get("resume_weights_only"):
        found.append(
            f"resume_weights_only=true with mode={mode}: mode={mode} reads the "
            "checkpoint's weights only already; leave resume_weights_only out"
        )
    target = cfg.get("target") or {}
    if target.get("metric") is not None:
        unset = " ".join(
            f"target.{k}=null" for k in ("metric", "value") if target.get(k) is not None
        )
        found.append(
            f"target.metric={target.get('metric')} with mode={mode}: a target is raced to "
            "while training, and this mode trains nothing; leave target.metric out (where a "
            f"preset sets it: {unset})"
        )
    return found


def world_problems(cfg, env) -> list[str]:
    """``mode=predict`` writes one file of outputs in the data's order: from one process."""
    if cfg.get("mode") == "predict" and env.world_size > 1:
        return [
            f"mode=predict runs in one process, but this run has {env.world_size} "
            f"(strategy={(cfg.get('strategy') or {}).get('name')}, trainer.devices="
            f"{cfg.trainer.get('devices')}): use strategy=auto trainer.devices=1"
        ]
    return []


def core_problems(cfg, env, plan) -> list[str]:
    found = problems(cfg, TRAINER_RULES) + world_problems(cfg, env)
    if env.accelerator == "cuda" and not torch.cuda.is_available():
        found.append(
            f"trainer.accelerator={cfg.trainer.accelerator} but this machine has no CUDA device; "
            "allowed here: cpu or auto"
        )
    found += _trainer_argument_problems(cfg) + _length_problems(cfg, plan)
    found += unread_keys.problems(cfg)
    given = _single_run_overrides()
    found += inert_problems(cfg, given) + own_settings_problems(cfg, plan, given)
    found += missing_hook_problems(cfg, plan)
    found += plan.problems + check_optim(cfg) + callbacks.problems(cfg) + clip_problems(cfg, plan)
    return found


def inert_problems(cfg, given: list[str] | None = None) -> list[str]:
    """A setting of a plugin that is off, given on the command line of a single run
    (``ema=off ema.decay=0.9``), does nothing: refused, as a key nothing reads is. The same
    setting from a config file is kept for when the plugin is switched on (a preset's
    ``activation_checkpointing.block_types: [Block]``, docs/your_own_model.md), and in a sweep
    it is inert where the plugin is off, read where it is on (``-m ema=off,on ema.decay=0.9``):
    each job is one point of the sweep's grid, which gives the setting to all of them.
    ``given``: the command line's overrides (default: this command's, from Hydra; none for a
    config composed in-process or a sweep's job)."""
    from tuneup.trainer.off_options import inert_settings, options_switching_on

    given = _single_run_overrides() if given is None else given
    named = {o.split("=", 1)[0].lstrip("+~") for o in given}
    found = []
    for group, key, value in inert_settings(cfg):
        if f"{group}.{key}" not in named:
            continue
        on = " or ".join(f"{group}={o}" for o in options_switching_on(group))
        found.append(
            f"{group}.{key}={value} does nothing: {group}=off leaves the plugin out, "
            f"nothing reads its settings; switch it on with {on}, or leave "
            f"{group}.{key} out (in a sweep, -m {group}=off,... {group}.{key}={value} "
            "sets it where the plugin is on)"
        )
    return found


def _single_run_overrides() -> list[str]:
    """The command line's overrides of this run, where it is a command's single run (not one
    job of a Hydra multirun: a sweep, an autotune's trial); none otherwise."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode == RunMode.MULTIRUN:
        return []
    return list(HydraConfig.get().overrides.task)


def _length_problems(cfg, plan) -> list[str]:
    """A schedule that needs the run's length, in a run without one (tuneup's schedule: a
    LightningModule's own is its own, trainer/own_optimizer.py)."""
    t = cfg.trainer
    if plan.lightning:
        return []
    endless = t.get("max_epochs") == -1 and t.get("max_steps", -1) == -1
    if endless and OmegaConf.select(cfg, "scheduler.name") != "constant":
        return [
            "trainer.max_epochs=-1 and trainer.max_steps=-1: the run has no end, but "
            f"scheduler={cfg.scheduler.name} needs the number of steps; set trainer.max_steps "
            "(or trainer.max_epochs), or use scheduler=constant"
        ]
    return []


#: Trainer arguments conf/config.yaml sets; others are looked up in Lightning's signature.
KNOWN_ARGUMENTS = {
    "accelerator",
    "devices",
    "num_nodes",
    "max_epochs",
    "max_steps",
    "log_every_n_steps",
    "num_sanity_val_steps",
    "enable_model_summary",
    "enable_progress_bar",
}


def _trainer_argument_problems(cfg) -> list[str]:
    found = []
    if set(cfg.trainer) - KNOWN_ARGUMENTS:  # importing Lightning costs seconds: only if needed
        import pytorch_lightning as pl

        allowed = set(inspect.signature(pl.Trainer.__init__).parameters) - {"self"}
        for key in cfg.trainer:
            if key not in allowed:
                match = did_you_mean(key, allowed)
                hint = f"did you mean trainer.{match}? " if match else ""
                found.append(
                    f"trainer.{key} is not a Lightning Trainer argument; {hint}"
                    f"allowed: {', '.join(sorted(allowed))}"
                )
    devices = cfg.trainer.get("devices", "auto")
    if not (devices == "auto" or (Integer(low=-1)(devices) and devices != 0) or _is_list(devices)):
        found.append(
            problem(
                "trainer.devices",
                devices,
                "an integer >= 1, -1 (all), 'auto', or a list of device indices",
            )
        )
    for key in ("limit_train_batches", "limit_val_batches", "val_check_interval"):
        value = cfg.trainer.get(key)
        if value is not None and not _fraction_or_count(value):
            found.append(problem(f"trainer.{key}", value, _FRACTION_OR_COUNT))
    return found


def _is_list(value) -> bool:
    return hasattr(value, "__len__") and not isinstance(value, str) and len(value) > 0


def _fraction_or_count(value) -> bool:
    if isinstance(value, float):
        return 0 < value <= 1
    return Integer(low=0)(value)
