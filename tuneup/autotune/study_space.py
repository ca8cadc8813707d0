"""The space of the time-to-target study: what each trial samples, as overrides.

``autotune.params`` (or, when null, :func:`default_params`, derived from the user's command)
and the command line's sweep overrides (``model.lr='tag(log, interval(1e-3, 1))'``) are
Hydra's sweeper syntax, parsed as ``hparams_search=optuna`` parses it (tuneup/optuna/space.py).
A key of the command line replaces the same key of the params.

Conditional parameters, define-by-run: a key ``G.k`` whose ``G`` is itself a choice of the
space (``ema`` and ``ema.decay``; ``label_smoothing`` and ``label_smoothing.amount``;
``scheduler`` and ``scheduler.warmup_steps``) is sampled only in trials whose ``G`` is not
``off``, so TPE (``group=True``) models it only where it exists.

Before any trial, each choice of a config group (``scheduler=wsd``, ``ema=on``) is composed
and checked as its job would be (space.Checks): one that does not compose in this install or
that a check refuses is dropped, and listed as never launched with the reason.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from tuneup.optuna.space import override_value, parse_space

OFF = ("off", "none", "false")


def default_params(cfg, warmup_steps: int | None = None, own_loop: bool = False) -> dict[str, str]:
    """What decides races, around the user's own values (docs/autotune.md#time-to-target).
    ``own_loop``: the model is the user's LightningModule, whose own code builds the optimizer,
    schedule and loss: those keys would change nothing (its own arguments: sweep them, e.g.
    ``model.lr='tag(log, interval(1e-3, 1))'``)."""
    found: dict[str, str] = {}
    optimizer = {} if own_loop else cfg.get("optimizer") or {}
    lr = optimizer.get("lr")
    if isinstance(lr, int | float) and lr > 0:
        found["optimizer.lr"] = f"tag(log, interval({_num(lr / 10)}, {_num(lr * 30)}))"
    if not own_loop:
        found["scheduler"] = "choice(constant, cosine, wsd)"
    if warmup_steps and not own_loop:
        found["scheduler.warmup_steps"] = f"range(0, {max(1, int(warmup_steps)) + 1})"
    decay = optimizer.get("weight_decay")
    if isinstance(decay, int | float) and decay > 0:
        found["optimizer.weight_decay"] = (
            f"tag(log, interval({_num(decay / 10)}, {_num(decay * 10)}))"
        )
    batch = (cfg.get("data") or {}).get("batch_size")
    if isinstance(batch, int) and batch >= 8:
        sizes = sorted({max(1, batch // 2), batch, batch * 2, batch * 4})
        found["data.batch_size"] = f"choice({', '.join(map(str, sizes))})"
    if not own_loop:
        found["label_smoothing"] = "choice(off, on)"
        found["label_smoothing.amount"] = "interval(0.02, 0.3)"
    found["ema"] = "choice(off, on)"
    found["ema.decay"] = "interval(0.9, 0.999)"
    return found


@dataclass
class StudySpace:
    distributions: dict = field(default_factory=dict)  # key -> Optuna distribution, in order
    fixed: dict[str, str] = field(default_factory=dict)
    dropped: list[tuple[str, str]] = field(default_factory=list)  # (override, why never launched)

    def parent(self, key: str) -> str | None:
        """The choice ``key`` depends on (``ema`` for ``ema.decay``), if it is in the space."""
        head = key.rsplit(".", 1)[0] if "." in key else None
        while head is not None:
            if isinstance(self.distributions.get(head), CategoricalDistribution):
                return head
            head = head.rsplit(".", 1)[0] if "." in head else None
        return None

    def sample(self, trial) -> dict:
        """The trial's values, define-by-run (a conditional key only where its choice is on)."""
        values: dict = {}
        for key, dist in self.distributions.items():
            parent = self.parent(key)
            if parent is not None and str(values.get(parent)).lower() in OFF:
                continue
            values[key] = suggest(trial, key, dist)
        return values

    def overrides(self, values: dict) -> tuple[str, ...]:
        """The trial's overrides: its sampled values, then the fixed ones."""
        sampled = [f"{key}={override_value(value)}" for key, value in values.items()]
        return tuple(sampled + [f"{key}={value}" for key, value in self.fixed.items()])


def suggest(trial, key: str, dist):
    if isinstance(dist, CategoricalDistribution):
        return trial.suggest_categorical(key, list(dist.choices))
    if isinstance(dist, IntDistribution):
        return trial.suggest_int(key, dist.low, dist.high, step=dist.step, log=dist.log)
    if isinstance(dist, FloatDistribution):
        return trial.suggest_float(key, dist.low, dist.high, step=dist.step, log=dist.log)
    raise TypeError(f"{key}: {dist!r}")  # parse_space makes no other kind


def build_space(params: dict[str, str], sweeps: list[str], checks, is_group) -> StudySpace:
    """The space from ``params`` then the command line's sweeps; each group choice checked."""
    parsed = parse_space(params, sweeps)
    space = StudySpace(dict(parsed.distributions), dict(parsed.fixed))
    for key, dist in list(space.distributions.items()):
        if not (isinstance(dist, CategoricalDistribution) and is_group(key)):
            continue
        kept = []
        for choice in dist.choices:
            override = f"{key}={override_value(choice)}"
            inspection = checks.inspect((override,))
            if inspection.ok:
                kept.append(choice)
                continue
            why = "; ".join(inspection.problems)
            if why.startswith("does not compose"):
                why = f"not in this install's config ({why})"
            space.dropped.append((override, why))
        if len(kept) > 1:
            space.distributions[key] = CategoricalDistribution(kept)
        else:  # one choice left: every trial has it (none: the key is left alone)
            del space.distributions[key]
            if kept:
                space.fixed[key] = override_value(kept[0])
    for key in list(space.distributions):  # a condition whose choice is gone: gone too
        head = key.rsplit(".", 1)[0] if "." in key else None
        if head in params and head not in space.distributions and head not in space.fixed:
            del space.distributions[key]
    return space


def _num(value: float) -> str:
    """A short float for the space's text (3 significant digits)."""
    if value == 0 or not math.isfinite(value):
        return repr(float(value))
    return f"{value:.3g}" if "e" not in f"{value:.3g}" else repr(float(f"{value:.3g}"))
