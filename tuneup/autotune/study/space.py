"""The space of the time-to-target study: what each trial samples, as overrides.

``autotune.params`` (or, when null, :func:`default_params`, derived from the user's command)
and the command line's sweep overrides (``model.lr='tag(log, interval(1e-3, 1))'``) are
Hydra's sweeper syntax, parsed as ``hparams_search=optuna`` parses it (tuneup/optuna/space.py).
A key of the command line replaces the same key of the params.

Conditional parameters, define-by-run: a key ``G.k`` whose ``G`` is itself a choice of the
space (``ema`` and ``ema.decay``; ``label_smoothing`` and ``label_smoothing.amount``;
``scheduler`` and ``scheduler.warmup_steps``) is sampled only in trials whose ``G`` is not
``off``, so TPE (``group=True``) models it only where it exists. A key ``G.k@c`` is ``G.k``
sampled only where ``G`` is ``c``, with a range of its own (``optimizer.lr@muon``: Muon's
learning rate is not AdamW's, study/family.py); Optuna sees it under that name.

Before any trial, each choice of a config group (``scheduler=wsd``, ``ema=on``) is composed
and checked as its job would be (space.Checks): one that does not compose in this install or
that a check refuses is left out, with the reason. A choice refused with your value of another
group of the space, or with some of that group's choices, runs with the one it takes
(``optimizer=schedulefree`` with ``scheduler=constant``: its check refuses the others), and
that group is not sampled where it is the choice (study/companions.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from tuneup.autotune.study import companions as companions
from tuneup.autotune.study.family import family_params, lr_range, num
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
    family: dict[str, str] = {}
    if isinstance(lr, int | float) and lr > 0:
        family = family_params(optimizer, lr, warmup_steps)
        found.update(family or {"optimizer.lr": lr_range(lr)})
    if not own_loop:
        found["scheduler"] = "choice(constant, cosine, wsd)"
    if warmup_steps and not own_loop:
        found["scheduler.warmup_steps"] = f"range(0, {max(1, int(warmup_steps)) + 1})"
    decay = optimizer.get("weight_decay")
    if isinstance(decay, int | float) and decay > 0:  # your optimizer's (the others' own)
        key = f"optimizer.weight_decay@{optimizer['name']}" if family else "optimizer.weight_decay"
        found[key] = f"tag(log, interval({num(decay / 10)}, {num(decay * 10)}))"
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
    distributions: dict = field(default_factory=dict)  # name -> Optuna distribution, in order
    fixed: dict[str, str] = field(default_factory=dict)
    dropped: list[tuple[str, str]] = field(default_factory=list)  # (override, why left out)
    # "G=c" -> {H: d}: where G is c, H is d and not sampled (optimizer=schedulefree: constant)
    implied: dict[str, dict[str, str]] = field(default_factory=dict)

    def parent(self, name: str) -> str | None:
        """The choice ``name`` depends on (``ema`` for ``ema.decay``, ``optimizer`` for
        ``optimizer.lr@muon``), if it is in the space."""
        key = key_of(name)
        head = key.rsplit(".", 1)[0] if "." in key else None
        while head is not None:
            if isinstance(self.distributions.get(head), CategoricalDistribution):
                return head
            head = head.rsplit(".", 1)[0] if "." in head else None
        return None

    def applies(self, name: str, values: dict, implied: dict) -> bool:
        """Whether ``name`` is sampled in a trial that has ``values`` so far: its choice is on
        (is ``c`` for ``G.k@c``), and no choice made implies it or its group."""
        key = key_of(name)
        if any(key == k or key.startswith(f"{k}.") for k in implied):
            return False
        parent = self.parent(name)
        if parent is None:
            return True
        if parent not in values:
            return False
        chosen = str(values[parent])
        return chosen == name.split("@", 1)[1] if "@" in name else chosen.lower() not in OFF

    def sample(self, trial) -> dict:
        """The trial's values by override key, define-by-run (a conditional key only where
        its choice is; a choice's implied values with it)."""
        values: dict = {}
        implied: dict[str, str] = {}
        for name, dist in self.distributions.items():
            if not self.applies(name, values, implied):
                continue
            key = key_of(name)
            values[key] = suggest(trial, name, dist)
            implied.update(self.implied.get(f"{key}={override_value(values[key])}", {}))
        return {**values, **implied}

    def params_of(self, value_of) -> dict | None:
        """The Optuna params of a configuration (``value_of(key)``: its value), as sample()
        would draw them; None when a value is outside the space."""
        values, implied, params = {}, {}, {}
        for name, dist in self.distributions.items():
            if not self.applies(name, values, implied):
                continue
            key = key_of(name)
            value = value_of(key)
            if value is None or not _contains(dist, value):
                return None
            values[key] = params[name] = value
            implied.update(self.implied.get(f"{key}={override_value(value)}", {}))
        return params

    def overrides(self, values: dict) -> tuple[str, ...]:
        """The trial's overrides: its sampled values, then the fixed ones."""
        sampled = [f"{key}={override_value(value)}" for key, value in values.items()]
        return tuple(sampled + [f"{key}={value}" for key, value in self.fixed.items()])


def key_of(name: str) -> str:
    """The override key of a space entry (``optimizer.lr`` for ``optimizer.lr@muon``)."""
    return name.split("@", 1)[0]


def suggest(trial, key: str, dist):
    if isinstance(dist, CategoricalDistribution):
        return trial.suggest_categorical(key, list(dist.choices))
    if isinstance(dist, IntDistribution):
        return trial.suggest_int(key, dist.low, dist.high, step=dist.step, log=dist.log)
    if isinstance(dist, FloatDistribution):
        return trial.suggest_float(key, dist.low, dist.high, step=dist.step, log=dist.log)
    raise TypeError(f"{key}: {dist!r}")  # parse_space makes no other kind


def _contains(dist, value) -> bool:
    from tuneup.autotune.study.trials import contains

    return contains(dist, value)


def build_space(params: dict[str, str], sweeps: list[str], checks, is_group) -> StudySpace:
    """The space from ``params`` then the command line's sweeps; each group choice checked.
    A command-line key replaces the params' per-choice ones too (``optimizer.lr=...``: one
    range for every optimizer)."""
    yours_given = parse_space({}, sweeps)
    given = {key_of(k) for k in (*yours_given.distributions, *yours_given.fixed)}
    params = {k: v for k, v in params.items() if key_of(k) not in given or k in given}
    parsed = parse_space(params, sweeps)
    space = StudySpace(dict(parsed.distributions), dict(parsed.fixed))
    groups = [
        k
        for k, d in space.distributions.items()
        if isinstance(d, CategoricalDistribution) and is_group(k)
    ]
    yours = checks.inspect(()).config
    for key, kept in companions.check_choices(space, checks, groups, yours).items():
        space.distributions[key] = CategoricalDistribution(kept) if kept else None
        if len(kept) <= 1:  # one choice left: every trial has it (none: the key is left alone)
            del space.distributions[key]
            if kept:
                space.fixed[key] = override_value(kept[0])
                _imply(space, space.implied.pop(f"{key}={space.fixed[key]}", {}))
    for name in list(space.distributions):  # a condition whose choice is gone: gone too
        key = key_of(name)
        head = key.rsplit(".", 1)[0] if "." in key else None
        if "@" in name and head in space.fixed:  # its choice is every trial's, or no trial's
            dist = space.distributions.pop(name)
            if space.fixed[head] == override_value(name.split("@", 1)[1]):
                space.distributions[key] = dist
        elif _orphaned(space, name, head, params):
            del space.distributions[name]
    return space


def _orphaned(space: StudySpace, name: str, head: str | None, params: dict) -> bool:
    """Whether ``name``'s condition can no longer hold: its choice left the space."""
    if "@" in name:
        choices = space.distributions.get(head)
        return choices is None or name.split("@", 1)[1] not in map(str, choices.choices)
    return head in params and head not in space.distributions and head not in space.fixed


def _imply(space: StudySpace, values: dict[str, str]) -> None:
    """What every trial's choice implies: fixed, and no longer sampled (nor its keys)."""
    for key, value in values.items():
        space.fixed[key] = value
        for name in list(space.distributions):
            if key_of(name) == key or key_of(name).startswith(f"{key}."):
                del space.distributions[name]


def searched(space: StudySpace) -> list[dict]:
    """The space as autotune.md and autotune.json print it: each key, its distribution and
    where it is sampled (a row per per-choice range; the fixed keys last)."""
    rows = []
    for name, dist in space.distributions.items():
        where = []
        parent = space.parent(name)
        if parent is not None and "@" in name:
            where.append(f"where {parent}={name.split('@', 1)[1]}")
        elif parent is not None:
            where.append(f"where {parent} is not off")
        key = key_of(name)
        for choice, implied in space.implied.items():
            hit = [k for k in implied if key == k or key.startswith(f"{k}.")]
            if hit:
                where.append(f"not where {choice} (it runs with {hit[0]}={implied[hit[0]]})")
        rows.append(
            {
                "key": key,
                "name": name,
                "distribution": _text(dist),
                "condition": "; ".join(where) or "every trial",
            }
        )
    rows += [
        {"key": k, "name": k, "distribution": f"fixed: {v}", "condition": "every trial"}
        for k, v in space.fixed.items()
    ]
    return rows


def _text(dist) -> str:
    if isinstance(dist, CategoricalDistribution):
        return f"choice({', '.join(map(str, dist.choices))})"
    kind = "log-uniform" if dist.log else "uniform"
    if isinstance(dist, IntDistribution):
        kind = "integers, log-uniform" if dist.log else "integers"
    step = f", step {dist.step:g}" if dist.step not in (None, 1) else ""
    return f"{kind} [{dist.low:g}, {dist.high:g}]{step}"
