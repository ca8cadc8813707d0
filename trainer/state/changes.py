"""What changed since a checkpoint, and what each change does to the run that resumes it.

Every checkpoint holds the run's whole config, flattened to ``{dotted key: plain value}``
(:func:`snapshot`, in ``checkpoint["tuneup_run"]["config"]``). A resumed run compares it
with its own and judges every changed key (:func:`review`): either it takes effect from
the resumed step on, and the warning says so, or the checkpoint cannot continue under it
and the run refuses, naming the key and what to do instead:

- the model (``model.*``, or anything else that changes the weights' names or shapes):
  refused when the checkpoint's weights do not fit the model built now; start fresh;
- ``optimizer.name`` (and ``optimizer.exclude_norms_and_biases``, which regroups the
  parameters): the saved optimizer state (momentum, Adam moments) belongs to the old
  optimizer; refused, with two ways out: the old value, or a new run from the weights only
  (``resume=<path> resume_weights_only=true``);
- other ``optimizer.*`` keys: take effect, the optimizer's state continues
  (:func:`adopt_optimizer_settings` puts the new values into the checkpoint's optimizer
  state before Lightning restores it; Lightning alone keeps the saved ones, so
  ``optimizer.lr=0.5`` on resume was silently ignored);
- ``scheduler.*``, ``trainer.max_steps``/``max_epochs``: take effect; the learning rate
  follows the new schedule from the resumed step on (trainer/optim.py ``set_lr_from_schedule``);
- ``data.batch_size``, the world size and ``grad_accum.*``: take effect, also mid-epoch:
  the rest of the epoch's order is dealt in the new layout, and the warning says whether
  the steps are the same (the same global batch) or the rest is seen once in steps of
  the new one (trainer/state/layout.py);
- ``seed``: no effect (the checkpoint's random states and data order continue);
- everything else takes effect.

Nothing read from a checkpoint is instantiated or imported: values are compared and shown.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from omegaconf import OmegaConf

from tuneup.errors import TuneupError
from tuneup.trainer.state import layout
from tuneup.trainer.state.layout import Context

log = logging.getLogger(__name__)

#: Keys that say how this run starts, not how it trains.
IGNORED = ("resume", "resume_weights_only", "plugins.list")
#: What a key absent from one side shows as.
UNSET = "(unset)"
#: Optimizer keys whose change leaves the saved optimizer state without a home.
OPTIMIZER_LAYOUT = ("optimizer.name", "optimizer.exclude_norms_and_biases")
WEIGHTS_ONLY = (
    "resume with the old value, or start a new run from the checkpoint's weights only: "
    "resume=<path> resume_weights_only=true hydra.run.dir=<a new directory>"
)
START_FRESH = "resume with the old value, or start fresh in another directory (hydra.run.dir=...)"


def snapshot(cfg) -> dict:
    """``cfg`` as ``{dotted key: plain value}``, interpolations resolved where they resolve."""
    try:
        tree = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)
    except Exception:  # an interpolation that does not resolve here: keep its text
        tree = OmegaConf.to_container(cfg, resolve=False)
    flat: dict = {}

    def walk(node, prefix: str) -> None:
        for key, value in node.items():
            if isinstance(value, dict) and value:
                walk(_read(value) if not prefix else value, f"{prefix}{key}.")
            else:
                flat[f"{prefix}{key}"] = value

    walk(tree, "")
    return flat


def _read(node: dict) -> dict:
    """A top-level node as far as anything reads it: of a plugin that is off (``ema=off``), its
    name alone. Its settings (conf/ema/off.yaml carries ema=on's, for sweeps) are unread: a
    resumed run does not list them as changes when the plugin goes on, or when they change."""
    if "plugin" not in node and node.get("name") == "off":
        return {"name": "off"}
    return node


@dataclass
class Change:
    key: str
    old: object
    new: object
    note: str  # what it does to the resumed run, or why it cannot
    refused: bool = False

    def __str__(self) -> str:
        return f"{self.key}: {self.old!r} -> {self.new!r}: {self.note}"


def differences(saved: dict, current: dict) -> list[tuple[str, object, object]]:
    keys = sorted((set(saved) | set(current)) - set(IGNORED))
    found = []
    for key in keys:
        old, new = saved.get(key, UNSET), current.get(key, UNSET)
        if not _same(old, new):
            found.append((key, old, new))
    return found


def _same(a, b) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    return (type(a) is type(b) and a == b) or (_number(a) and _number(b) and a == b)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def judge(key: str, ctx: Context) -> tuple[str, bool]:
    """(what the change of ``key`` does, whether it is refused)."""
    section = key.split(".")[0]
    if key == "seed":
        return "no effect: the checkpoint's random states and data order continue", False
    if section in ("model", "task") and ctx.weights_problem:
        return f"the checkpoint's weights do not fit ({ctx.weights_problem}); {START_FRESH}", True
    if section in ("model", "task"):
        return "takes effect: the checkpoint's weights fit the model built with it", False
    if section in ("optimizer", "scheduler") and not ctx.owns_optimizer:
        return "no effect: the LightningModule builds its own optimizer and schedule", False
    if key in OPTIMIZER_LAYOUT:
        old = ctx.saved.get("config", {}).get("optimizer.name")
        return (
            f"the saved optimizer state (momentum, moments) of {old!r} cannot continue "
            f"under it; {WEIGHTS_ONLY}"
        ), True
    if section == "optimizer":
        return (
            f"takes effect from step {ctx.step}: the optimizer uses the new value, its state "
            "(momentum, moments) continues"
        ), False
    if section == "scheduler" or key in ("trainer.max_steps", "trainer.max_epochs"):
        return (
            f"takes effect from step {ctx.step}: the learning rate follows the new schedule "
            "(and the new limits) from there"
        ), False
    if key == "data.batch_size" or section == "grad_accum":
        return layout.key_note(key, ctx), False
    if section == "precision":
        return f"takes effect from step {ctx.step}", False
    if section == "data":
        return f"takes effect from step {ctx.step}: training goes on with the new data", False
    return "takes effect", False


def review(ctx: Context) -> list[Change]:
    """Every difference between the checkpoint's run and this one, judged."""
    saved_config, config = ctx.saved.get("config"), ctx.current["config"]
    changes = []
    if isinstance(saved_config, dict):
        for key, old, new in differences(saved_config, config):
            note, refused = judge(key, ctx)
            changes.append(Change(key, old, new, note, refused))
    else:  # a checkpoint of an older tuneup: only the settings it recorded
        for key in ("precision", "grad_accum", "data.batch_size", "seed", "data.name"):
            if key in ctx.saved and not _same(ctx.saved[key], ctx.current[key]):
                note, refused = judge(key, ctx)
                changes.append(Change(key, ctx.saved[key], ctx.current[key], note, refused))
    changes += [Change(*row) for row in layout.rows(ctx)]
    named = any(c.refused and c.key.split(".")[0] in ("model", "task") for c in changes)
    if ctx.weights_problem and not named:  # no model key changed (e.g. compile, kernels)
        note = f"the checkpoint's weights do not fit ({ctx.weights_problem}); {START_FRESH}"
        changes.append(Change("model weights", "as saved", "as built now", note, True))
    return changes


def report(path, changes: list[Change]) -> None:
    """Refuse (TuneupError) if any change is refused, listing them all; else warn about each."""
    if not changes:
        return
    refused = [c for c in changes if c.refused]
    if refused:
        others = [c.key for c in changes if not c.refused]
        also = f"\n  (also changed: {', '.join(others)})" if others else ""
        raise TuneupError(
            f"cannot resume {path} with these changed settings:\n"
            + "\n".join(f"  - {c}" for c in refused)
            + also
        )
    from tuneup.trainer.console import process_rank

    log.warning(  # said once per run: the other processes' own go to their log files
        "resuming %s with changed settings:\n%s",
        path,
        "\n".join(f"  - {c}" for c in changes),
        extra={} if process_rank() == "0" else {"file_only": True},
    )


# --------------------------------------------------------------------------------------
# making optimizer changes take effect
# --------------------------------------------------------------------------------------


def optimizer_layout_problem(checkpoint: dict, trainer, saved_names) -> str | None:
    """Why the checkpoint's optimizer state cannot be loaded into this run's optimizers."""
    fresh = trainer.optimizers
    names = [type(o).__name__ for o in fresh]
    if isinstance(saved_names, list) and saved_names != names:
        old, new = ", ".join(map(str, saved_names)), ", ".join(names)
        return f"the checkpoint's optimizer is {old}, this run's {new}"
    states = checkpoint.get("optimizer_states") or []
    for state, optimizer in zip(states, fresh, strict=False):
        saved = [len(g.get("params", ())) for g in state.get("param_groups", [])]
        now = [len(g["params"]) for g in optimizer.param_groups]
        if saved != now:
            return f"its parameter groups hold {saved} parameters in the checkpoint and {now} now"
    return None


def adopt_optimizer_settings(checkpoint: dict, trainer) -> None:
    """Put this run's optimizer settings (lr, momentum, weight decay, betas...) into the
    checkpoint's optimizer and scheduler states, in place, before Lightning restores them.

    The state proper (step counts, momentum buffers, moments) is kept, and so are the group
    entries an optimizer names in its ``group_state_keys`` attribute (schedule-free AdamW keeps
    its step count and average weights in the groups). A changed learning
    rate keeps the schedule's current factor: ``lr = saved lr x new initial / saved initial``.
    Equal settings change nothing, so an unchanged resume stays bit-exact.
    """
    # Layouts are equal here (optimizer_layout_problem was asked first).
    states = checkpoint.get("optimizer_states") or []
    for state, optimizer in zip(states, trainer.optimizers, strict=False):
        for saved, fresh in zip(state.get("param_groups", []), optimizer.param_groups, strict=True):
            adopt_group(saved, group_settings(optimizer, fresh))
    schedulers = checkpoint.get("lr_schedulers") or []
    for state, config in zip(schedulers, trainer.lr_scheduler_configs, strict=False):
        base = getattr(config.scheduler, "base_lrs", None)
        if base is not None and "base_lrs" in state:
            state["base_lrs"] = list(base)


def group_settings(optimizer, group: dict) -> dict:
    """A param group's settings: all but its ``params`` and the entries that are state, which
    the optimizer names in ``group_state_keys`` (plugins/schedulefree.py)."""
    kept = ("params", *getattr(optimizer, "group_state_keys", ()))
    return {k: v for k, v in group.items() if k not in kept}


def adopt_group(saved: dict, fresh: dict) -> None:
    """This run's settings of one parameter group (``fresh``) into a restored one (``saved``),
    in place; its ``params`` and the schedule's current factor of ``lr`` are kept."""
    for key, value in fresh.items():
        if key not in ("params", "lr", "initial_lr") and not _same(saved.get(key, UNSET), value):
            saved[key] = value
    if "initial_lr" in fresh and "initial_lr" in saved:
        old, new = saved["initial_lr"], fresh["initial_lr"]
        if not _same(old, new) and old:
            saved["lr"] = saved["lr"] * new / old
            saved["initial_lr"] = new
    elif "lr" in fresh and not _same(saved.get("lr"), fresh["lr"]):
        saved["lr"] = fresh["lr"]
