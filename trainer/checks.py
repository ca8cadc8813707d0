"""Checks of the core's own config keys: seed, components, and the Lightning Trainer arguments.

Plugins check their own groups in their ``check`` hook; the runner shows
these problems and the plugins' together.
"""

from __future__ import annotations

import functools
import inspect
import re

import torch
from omegaconf import DictConfig, OmegaConf

from tuneup.trainer import callbacks
from tuneup.trainer.hints import did_you_mean
from tuneup.trainer.optim import check_optim
from tuneup.trainer.own_optimizer import missing_hook_problems, own_settings_problems
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
    found += _trainer_argument_problems(cfg) + _length_problems(cfg, plan) + _unknown_keys(cfg)
    given = _single_run_overrides()
    found += inert_problems(cfg, given) + own_settings_problems(cfg, plan, given)
    found += missing_hook_problems(cfg, plan)
    found += plan.problems + check_optim(cfg) + callbacks.problems(cfg) + clip_problems(cfg, plan)
    return found


#: Groups whose built-in options list every key they read: a key added with + is a typo.
CLOSED_GROUPS = ("model", "data", "optimizer", "scheduler")


#: Nodes of conf/config.yaml itself that hold every key they read.
CLOSED_NODES = ("measure", "grad_accum", "plugins", "report")


def _unknown_keys(cfg) -> list[str]:
    """Keys nothing reads, added with Hydra's ``+`` (``+precison=bf16``, ``+optimizer.lrr=0.1``):
    they would be accepted and silently do nothing. At the top level, under conf/config.yaml's
    own nodes, and under a built-in option of a closed group. (``trainer.*``: Lightning's
    signature, below; a plugin's group: its own check.)"""
    from tuneup.trainer.config import builtin_dir

    found = _unknown_top_level(cfg)
    primary = _yaml(builtin_dir() / "config.yaml")
    for name in CLOSED_NODES:
        node, allowed = cfg.get(name), set(primary.get(name) or {})
        if isinstance(node, DictConfig):
            for key in sorted(set(node) - allowed):
                match = did_you_mean(key, allowed)
                hint = f"; did you mean {name}.{match}?" if match else ""
                found.append(
                    f"{name}.{key} is not a setting of {name}; its settings are: "
                    f"{', '.join(sorted(allowed))}{hint}"
                )
    for group in CLOSED_GROUPS:
        node = cfg.get(group)
        if node is None or "_target_" in node or not isinstance(node.get("name"), str):
            continue  # the user's own target: every key is its argument
        option = builtin_dir() / group / f"{node.name}.yaml"
        if not option.is_file():
            continue
        allowed = set(_yaml(option)) - {"defaults"}
        settings = ", ".join(sorted(allowed - {"name", "plugin"}))
        for key in sorted(set(node) - allowed):
            match = did_you_mean(key, allowed - {"name", "plugin"})
            hint = f"; did you mean {group}.{match}?" if match else _other_options(group, key)
            found.append(
                f"{group}.{key} is not a setting of {group}={node.name}; its settings "
                f"are: {settings}{hint}"
            )
    return found + _unknown_feature_keys(cfg)


def unread_key_problems(cfg, keys: list[str]) -> list[str]:
    """Those problems of :func:`_unknown_keys` that are about ``keys`` (a search space's: a
    key given in a sweep is a key of every job, without Hydra's ``+``)."""
    return [p for p in _unknown_keys(cfg) if p.split(" ", 1)[0].split("=", 1)[0] in keys]


def _other_options(group: str, key: str) -> str:
    """``; it is a setting of model=mlp``: the built-in options of ``group`` that have ``key``."""
    from tuneup.trainer.config import builtin_dir

    others = sorted(p.stem for p in (builtin_dir() / group).glob("*.yaml") if key in _yaml(p))
    return f"; it is a setting of {' and '.join(f'{group}={o}' for o in others)}" if others else ""


def inert_problems(cfg, given: list[str] | None = None) -> list[str]:
    """A setting of a plugin that is off, given on the command line of a single run
    (``ema=off ema.decay=0.9``), does nothing: refused, as a key nothing reads is. The same
    setting from a config file is kept for when the plugin is switched on (a preset's
    ``activation_checkpointing.block_types: [Block]``, docs/your_own_model.md), and in a sweep
    it is inert where the plugin is off, read where it is on (``-m ema=off,on ema.decay=0.9``):
    each job is one point of the sweep's grid, which gives the setting to all of them.
    ``given``: the command line's overrides (default: this command's, from Hydra; none for a
    config composed in-process or a sweep's job)."""
    from tuneup.trainer.config import inert_settings, options_switching_on

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


#: Feature groups whose plugin names its own unknown keys in its check.
SELF_CHECKED = ("strategy", "checkpoint")


def _unknown_feature_keys(cfg) -> list[str]:
    """Keys under a built-in feature group's node that none of its options has
    (``+precision.init_scal=1024``): its plugin reads only those (optional ones included, as
    ``precision.skip`` of fp8), so this one would do nothing."""
    from tuneup.trainer.config import builtin_dir, searched_dirs

    builtin, found = builtin_dir(), []
    for group in sorted(p.name for p in builtin.iterdir() if p.is_dir()):
        node = cfg.get(group)
        if group in (*CLOSED_GROUPS, *SELF_CHECKED, "hydra") or not isinstance(node, DictConfig):
            continue
        allowed = _option_keys([builtin / group])
        if set(node) - allowed:  # options of the user's or a plugin's folders may add keys
            allowed = _option_keys([d / group for d in searched_dirs()])
        for key in sorted(set(node) - allowed):
            match = did_you_mean(key, allowed - {"name", "plugin"})
            hint = f"; did you mean {group}.{match}?" if match else ""
            settings = ", ".join(sorted(allowed - {"name", "plugin"})) or "none"
            found.append(
                f"{group}.{key} is not a setting of any {group} option; their settings "
                f"are: {settings}{hint}"
            )
    return found


def _option_keys(folders) -> set[str]:
    """Every top-level key the option files in ``folders`` give their node."""
    keys: set[str] = set()
    for folder in folders:
        for path in folder.glob("*.yaml") if folder.is_dir() else []:
            keys |= set(_yaml(path)) - {"defaults"}
    return keys


def _yaml(path) -> dict:
    """A config file's mapping (``{}`` if it holds none), for its keys: read with PyYAML's C
    loader (50x OmegaConf.load, which every run paid some 50 times here) and kept while the
    file is unchanged."""
    stat = path.stat()
    return _read_yaml(str(path), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=512)
def _read_yaml(path: str, _mtime_ns: int, _size: int) -> dict:
    import yaml

    with open(path) as f:
        loaded = yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    return loaded if isinstance(loaded, dict) else {}


def _unknown_top_level(cfg) -> list[str]:
    """Top-level keys no config file gives and nothing reads (``+precison=bf16``): not a key of
    conf/config.yaml, not a config group, not set by a preset, not a node switching a plugin
    on (``plugin: <name>``), and not used by an interpolation (``${my_width}``)."""
    from tuneup.trainer.config import builtin_dir, searched_dirs, top_level_keys

    builtin = builtin_dir()
    common = set(_yaml(builtin / "config.yaml")) | {p.name for p in builtin.iterdir()}
    unknown = [
        k
        for k in cfg
        if k not in common and not (isinstance(cfg.get(k), DictConfig) and "plugin" in cfg[k])
    ]
    if not unknown:
        return []  # the usual case, without reading every config file
    known = top_level_keys(searched_dirs())
    unknown = [k for k in unknown if k not in known]
    if unknown:
        text = OmegaConf.to_yaml(cfg, resolve=False)  # interpolations as written
        known |= {n for ref in re.findall(r"\$\{([^}]*)\}", text) for n in re.findall(r"\w+", ref)}
    found = []
    for key in unknown:
        if key in known:
            continue
        value = cfg.get(key)
        shown = key if isinstance(value, DictConfig) else f"{key}={value}"
        match = did_you_mean(key, known, prefer=_is_node(cfg) if shown == key else None)
        hint = f"; did you mean {_meant(match, value)}?" if match else ""
        found.append(
            f"{shown} is not allowed: {key} is not a config group or setting, nothing "
            f"would read it{hint}"
        )
    return found


def _is_node(cfg):
    """For ``+modle.hidden=32``: whether a top-level name is a node or a group (``model``),
    which a key with parts can be meant for, unlike a value (``mode``)."""
    from tuneup.trainer.config import builtin_dir

    return lambda name: isinstance(cfg.get(name), DictConfig) or (builtin_dir() / name).is_dir()


def _meant(name: str, value) -> str:
    """``name`` with ``value`` as an override: ``model.hidden=32`` for ``{hidden: 32}``."""
    if not isinstance(value, DictConfig):
        return f"{name}={value}"
    leaves = [(k, v) for k, v in value.items() if not isinstance(v, DictConfig)]
    if len(value) == 1 and len(leaves) == 1:
        return f"{name}.{leaves[0][0]}={leaves[0][1]}"
    return name


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
