"""The search space: candidates per dimension, and which of them may be launched here.

A candidate is a few overrides (``precision=bf16``; ``kernels=[cross_entropy]
kernels.require_triton=true``) from ``autotune.space``, tried on top of the recipe found
so far. Before any trial, in the sweeper's process, each candidate's config is composed as
its job would be (Hydra's own config loader, so the user's ``--config-dir``, ``./conf`` and
installed plugins' groups apply) and checked as the run itself checks it:
``Plan(cfg).problems`` and the Trainer arguments (the core's checks) plus every plugin's
``check(cfg, env, plan)``. Nothing is built but the data module and the model on the meta
device. A candidate that does not compose or that the checks refuse is never launched.

Nor is one that would change nothing on this machine, or lose, in the plugins' own words
(``describe()``): a plugin that says ``effect: none ...`` (cudnn_benchmark off CUDA) or
``effect: slower ...`` (precision=fp16 on a CPU: about 75x a float32 step), or a
precision that runs as one already tried (``ran_as``: tf32 runs as fp32 on a CPU, amp as
bf16 where bf16 is supported).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from omegaconf import DictConfig, ListConfig, OmegaConf

from tuneup import TuneupError

REFUSED, SKIPPED = "refused", "skipped"


@dataclass(frozen=True)
class Candidate:
    dimension: str
    overrides: tuple[str, ...]

    @property
    def label(self) -> str:
        return " ".join(self.overrides)

    @property
    def changes_precision(self) -> bool:
        return any(o.lstrip("+~").split("=")[0].startswith("precision") for o in self.overrides)


@dataclass(frozen=True)
class Inspection:
    """What the checks say about one configuration, before anything is launched."""

    problems: tuple[str, ...]
    effects: dict  # plugin name -> its effective settings (describe())
    config: object = None  # the composed config (None when it did not compose)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def ran_as(self) -> str | None:
        return (self.effects.get("precision") or {}).get("ran_as")


class Checks:
    """Composes and checks configurations (``compose(overrides) -> cfg``), each once."""

    def __init__(self, compose: Callable[[list[str]], object]) -> None:
        self.compose = compose
        self.seen: dict[tuple[str, ...], Inspection] = {}

    def inspect(self, overrides: tuple[str, ...]) -> Inspection:
        if overrides not in self.seen:
            self.seen[overrides] = self._inspect(list(overrides))
        return self.seen[overrides]

    def _inspect(self, overrides: list[str]) -> Inspection:
        try:
            cfg = self.compose(overrides)
        except Exception as exc:  # Hydra's composition errors: an unknown key, group or option
            return Inspection((f"does not compose: {_meant(overrides) or _first_line(exc)}",), {})
        from tuneup.trainer.checks import core_problems
        from tuneup.trainer.components import Plan
        from tuneup.trainer.environment import Environment
        from tuneup.trainer.plugin_manager import PluginManager

        try:
            plugins = PluginManager.from_config(cfg)
            env = Environment.from_config(cfg)
            plan = Plan(cfg, plugins)
            found = core_problems(cfg, env, plan) + plugins.check(cfg, env, plan)
        except TuneupError as exc:
            return Inspection((str(exc),), {}, cfg)
        return Inspection(tuple(found), plugins.describe(cfg) if not found else {}, cfg)


def why_not(
    candidate: Inspection, reference: Inspection, kept: dict[str, Inspection], precision: bool
) -> tuple[str, str] | None:
    """(refused | skipped, why) when a candidate must not be launched; None when it may.

    ``kept``: the candidates of this dimension already kept (label -> inspection), so two
    that run alike here are measured once; ``precision``: the candidate changes the
    precision, whose ``ran_as`` says what it runs as here."""
    if not candidate.ok:
        return REFUSED, "; ".join(candidate.problems)
    if _fingerprint(candidate.config) == _fingerprint(reference.config):
        return SKIPPED, "the recipe so far already has it"
    for name, settings in candidate.effects.items():
        effect = (settings or {}).get("effect") if isinstance(settings, dict) else None
        if isinstance(effect, str) and effect.startswith("none"):
            return SKIPPED, f"{name}: {effect}"
        if isinstance(effect, str) and effect.startswith("slower"):  # its check predicts a loss
            return SKIPPED, f"predicted to lose, {name}: {effect}"
    ran_as = candidate.ran_as if precision else None
    if ran_as is not None and ran_as == reference.ran_as:
        why = (candidate.effects.get("precision") or {}).get("why")
        return SKIPPED, f"runs as {ran_as} here, as the recipe so far does" + (
            f" ({why})" if why else ""
        )
    if _plugins_only(candidate, reference) and _effective(candidate) == _effective(reference):
        return SKIPPED, "changes no plugin's effective settings here (describe()), the name aside"
    for label, other in kept.items():
        alike = _plugins_only(candidate, other) and _effective(candidate) == _effective(other)
        if alike or (ran_as and ran_as == other.ran_as):
            return SKIPPED, f"runs as `{label}` does here, which is tried"
    return None


def half_weights(candidate: Inspection, reference: Inspection, allowed: bool):
    """(skipped, why) for a candidate that trains pure half weights (bf16-true, fp16-true: no
    float32 master weights) where the recipe so far does not, unless the user opted in with
    ``autotune.allow_half_weights=true``. Updates smaller than half a unit in the last place
    of a half weight are lost (bfloat16 keeps 8 bits of mantissa: an update under 1/256 of
    the weight rounds away), so the loss drifts late in a run, when updates are small: a
    trial's few steps of loss curve cannot see it."""
    if allowed or candidate.config is None:
        return None
    mine = candidate.config.get("precision", {}).get("name")
    theirs = "" if reference.config is None else reference.config.get("precision", {}).get("name")
    if str(mine).endswith("-true") and not str(theirs).endswith("-true"):
        return SKIPPED, (
            f"precision={mine} trains pure half weights (no fp32 master weights): small updates "
            "round away late in a run, which a trial's short loss check cannot see; opt in "
            "with autotune.allow_half_weights=true"
        )
    return None


def _plugins_only(one: Inspection, other: Inspection) -> bool:
    """Whether the two configs differ only in plugins' nodes (``plugin: <name>``), whose
    effect their describe() states; the core's keys (an lr, a batch size) it does not."""
    a, b = one.config, other.config
    if a is None or b is None:
        return False
    differing = {k for k in {*a, *b} - {"hydra"} if _yaml(a.get(k)) != _yaml(b.get(k))}
    return all(_is_plugin(a.get(k)) or _is_plugin(b.get(k)) for k in differing)


def _is_plugin(node) -> bool:
    return isinstance(node, DictConfig) and "plugin" in node


def _yaml(node) -> str:
    return OmegaConf.to_yaml(node) if isinstance(node, DictConfig | ListConfig) else repr(node)


def _effective(inspection: Inspection) -> dict:
    """Every plugin's effective settings without the choice's name and the explanation."""
    return {
        name: {k: v for k, v in settings.items() if k not in ("name", "why")}
        if isinstance(settings, dict)
        else settings
        for name, settings in inspection.effects.items()
    }


def _fingerprint(cfg) -> str | None:
    if cfg is None:
        return None
    node = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
    return OmegaConf.to_yaml(node)


def _meant(overrides: list[str]) -> str | None:
    """The command's own line for a key Hydra refused (``optimizer.fused`` under
    ``optimizer=sgd``: the options that have it), rather than Hydra's "Could not override"."""
    from tuneup.trainer.hints import override_hints

    try:
        return next(iter(override_hints(overrides)), None)
    except Exception:  # a hint must never hide the refusal itself
        return None


def _first_line(exc: Exception) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


def own_loop(config) -> bool:
    """Whether the model is the user's own LightningModule (its code builds the optimizer)."""
    from tuneup.trainer.components import Plan

    try:
        return bool(Plan(config).lightning)
    except Exception:  # a model that cannot be imported here: the checks say so
        return False
