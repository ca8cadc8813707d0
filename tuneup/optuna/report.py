"""What an Optuna sweep found, written into the sweep directory when it ends:

- ``optuna_report.md``: the study, every trial with its state, objectives and values, the best
  trial (one objective) or the trials on the Pareto front (several), the pruned trials and the
  step where each stopped;
- ``pareto.png`` (two or more objectives): the first two objectives of every complete trial,
  the front marked and labelled with its trial numbers;
- ``optimization_results.yaml``: the best values, or the front, as hydra-optuna-sweeper wrote it.

tuneup's sweep report (report.md, tuneup/report/) compares the same runs' speed and memory.
"""

from __future__ import annotations

import logging
from pathlib import Path

from omegaconf import OmegaConf
from optuna.trial import FrozenTrial, TrialState

from tuneup.optuna.study import INTERRUPTED_ATTR, RETRY_ATTR, RUN_DIR_ATTR

log = logging.getLogger(__name__)

MARKDOWN_FILE, FRONT_FILE, RESULTS_FILE = (
    "optuna_report.md",
    "pareto.png",
    "optimization_results.yaml",
)


def write_report(study, sweep_dir: Path, objectives: list[str], storage: str) -> list[Path]:
    """Write the files above; returns their paths."""
    sweep_dir = Path(sweep_dir)
    trials = study.get_trials(deepcopy=False)
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    best = _best(study, complete)
    written = [sweep_dir / MARKDOWN_FILE]
    written[0].write_text(markdown(study, trials, best, objectives, storage, sweep_dir))
    if best:
        OmegaConf.save(OmegaConf.create(results(best, objectives)), sweep_dir / RESULTS_FILE)
        written.append(sweep_dir / RESULTS_FILE)
    if len(objectives) > 1 and complete:
        try:
            written.append(draw_front(complete, best, objectives, study, sweep_dir / FRONT_FILE))
        except ImportError:
            log.warning(
                "optuna: pareto.png not drawn: it needs matplotlib (pip install 'tuneup[sweep]')"
            )
    log.info("optuna: %s", ", ".join(str(p) for p in written))
    return written


def _best(study, complete: list[FrozenTrial]) -> list[FrozenTrial]:
    """The best trial (one objective) or the Pareto front (several); none before a trial completes."""
    if not complete:
        return []
    return [study.best_trial] if len(study.directions) == 1 else list(study.best_trials)


def markdown(study, trials, best, objectives, storage: str, sweep_dir: Path) -> str:
    directions = [d.name.lower() for d in study.directions]
    counts = {s: sum(t.state == s for t in trials) for s in TrialState}
    lines = [
        f"# Optuna study `{study.study_name}`",
        "",
        f"Storage: `{storage}`. Objectives: "
        + ", ".join(f"`{o}` ({d})" for o, d in zip(objectives, directions, strict=True))
        + f". Trials: {len(trials)}: "
        + ", ".join(f"{counts[s]} {s.name.lower()}" for s in TrialState if counts[s])
        + ".",
        "",
    ]
    numbers = ", ".join(str(t.number) for t in best)
    if not best:
        lines.append("**No trial completed**: no best trial.")
    elif len(objectives) == 1:
        lines.append(
            f"**Best: trial {numbers}**, {objectives[0]} {_fmt(best[0].value)}: "
            + _params_cell(best[0])
        )
    else:
        lines.append(
            f"**Pareto front: trials {numbers}** (no other trial is as good in every "
            f"objective and better in one; {FRONT_FILE})"
        )
    on_front = {t.number for t in best}
    lines += [
        "",
        "| trial | state | " + " | ".join(objectives) + " | params | run |",
        "|---" * (len(objectives) + 4) + "|",
    ]
    for t in trials:
        state = t.state.name.lower() + (
            " (front)" if on_front and t.number in on_front and len(objectives) > 1 else ""
        )
        state += _continued(t)
        values = (
            t.values if t.values and t.state == TrialState.COMPLETE else [None] * len(objectives)
        )
        cells = [
            str(t.number),
            state,
            *(_fmt(v) for v in values),
            _params_cell(t),
            _run(t, sweep_dir),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    pruned = [t for t in trials if t.state == TrialState.PRUNED]
    if pruned:
        lines += [
            "",
            "## Pruned trials",
            "",
            f"| trial | stopped at step | {objectives[0]} there | run |",
            "|---|---|---|---|",
        ]
        for t in pruned:
            step = t.last_step
            value = t.intermediate_values.get(step) if step is not None else None
            lines.append(f"| {t.number} | {step} | {_fmt(value)} | {_run(t, sweep_dir)} |")
    return "\n".join(lines) + "\n"


def results(best: list[FrozenTrial], objectives: list[str]) -> dict:
    if len(objectives) == 1:
        return {"name": "optuna", "best_params": best[0].params, "best_value": best[0].value}
    return {
        "name": "optuna",
        "objectives": list(objectives),
        "solutions": [{"trial": t.number, "params": t.params, "values": t.values} for t in best],
    }


def draw_front(complete, front, objectives, study, path: Path) -> Path:
    """Every complete trial by its first two objectives; the front in red, named."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 5), dpi=100)
    ax.scatter(
        [t.values[0] for t in complete], [t.values[1] for t in complete], color="0.6", label="trial"
    )
    ordered = sorted(front, key=lambda t: t.values[0])
    ax.plot(
        [t.values[0] for t in ordered],
        [t.values[1] for t in ordered],
        "o-",
        color="tab:red",
        label="Pareto front",
    )
    for t in complete:
        ax.annotate(
            str(t.number),
            (t.values[0], t.values[1]),
            textcoords="offset points",
            xytext=(4, 4),
            fontsize=8,
        )
    directions = [d.name.lower() for d in study.directions]
    ax.set_xlabel(f"{objectives[0]} ({directions[0]})")
    ax.set_ylabel(f"{objectives[1]} ({directions[1]})")
    ax.set_title(
        f"study {study.study_name}: Pareto front = trials "
        + ", ".join(str(t.number) for t in sorted(front, key=lambda t: t.number))
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _params_cell(trial: FrozenTrial) -> str:
    """The trial's sampled values as overrides; ``-`` when the space is empty (all fixed)."""
    params = " ".join(f"{k}={_fmt(v)}" for k, v in trial.params.items())
    return f"`{params}`" if params else "-"


def _continued(trial: FrozenTrial) -> str:
    """`` (interrupted)``: its sweep was killed under it; `` (retry of 2)``: runs its values."""
    if trial.user_attrs.get(INTERRUPTED_ATTR):
        return " (interrupted)"
    retried = trial.user_attrs.get(RETRY_ATTR)
    return "" if retried is None else f" (retry of {retried})"


def _run(trial: FrozenTrial, sweep_dir: Path) -> str:
    run_dir = trial.user_attrs.get(RUN_DIR_ATTR)
    if not run_dir:
        return "-"
    path = Path(run_dir)
    return (
        str(path.relative_to(sweep_dir.resolve()))
        if path.is_relative_to(sweep_dir.resolve())
        else str(path)
    )


def _fmt(value) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}" if isinstance(value, float) else str(value)
