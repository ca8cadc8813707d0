"""A sweep's runs compared: the report's settings, the baseline, the ranking and the best run.

:class:`Report` is what the report's parts draw (markdown.py, figure.py, curves.py, race.py,
trials.py) and :func:`.build.build_report` fills; they import it from here. The package's
``__init__`` only re-exports, so no module of the package imports the package itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tuneup.errors import TuneupError
from tuneup.report.runs import Run, natural_key, saved_node

RANK_BY = ("samples_per_s", "val_acc")
#: Of the speed-up intervals in the report.
CONFIDENCE = 0.95


class ReportError(TuneupError):
    """The report cannot be made as asked (no runs, an unknown baseline or setting)."""


@dataclass(frozen=True)
class Settings:
    baseline: str | None = None
    rank_by: str = "samples_per_s"
    val_acc_tolerance: float = 0.01

    @classmethod
    def from_node(cls, node) -> Settings:
        """Settings from a ``report`` config node (missing keys: the defaults)."""
        node = node or {}
        default = cls()
        baseline = node.get("baseline", default.baseline)
        return cls(
            baseline=None if baseline is None else str(baseline),
            rank_by=node.get("rank_by", default.rank_by),
            val_acc_tolerance=float(node.get("val_acc_tolerance", default.val_acc_tolerance)),
        )

    def check(self) -> None:
        if self.rank_by not in RANK_BY:
            raise ReportError(
                f"report.rank_by={self.rank_by!r} is not allowed: expected one of "
                f"{', '.join(RANK_BY)}"
            )
        if not self.val_acc_tolerance >= 0:
            raise ReportError(
                f"report.val_acc_tolerance={self.val_acc_tolerance} is not allowed: expected a "
                "number >= 0 (an absolute accuracy difference, e.g. 0.01)"
            )


@dataclass
class Report:
    directory: Path
    settings: Settings
    runs: list[Run]  # in table order
    baseline: Run
    best: Run | None
    common_overrides: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    drawn: list[Path] = field(default_factory=list)  # the figures written (report.md links them)
    #: With a target (target.metric and target.value): the runs grouped by configuration over
    #: their seeds, ranked, and the best group (race.py); the headline is then time to target.
    race: object | None = None  # race.Race
    #: The sweep is an autotune (experiment=autotune): its answer is autotune.md, and this
    #: report lists its trials without naming a best (markdown.py).
    autotune: bool = False

    @property
    def best_runs(self) -> list[Run]:
        """The runs marked best: the best configuration's seeds in a race, else the best run."""
        if self.race is not None:
            return list(self.race.best.runs) if self.race.best is not None else []
        return [self.best] if self.best is not None else []

    def speed_up(self, run: Run) -> float | None:
        return _ratio(run.samples_per_s, self.baseline.samples_per_s if self.baseline.ok else None)

    def speed_up_interval(self, run: Run):
        """The speed-up's interval from the windows of the run and the baseline (None for
        the baseline itself, or without two windows on each side)."""
        from tuneup.stats.interval import welch

        if run is self.baseline or not (run.ok and self.baseline.ok):
            return None
        return welch(self.baseline.windows, run.windows, CONFIDENCE)

    def memory_ratio(self, run: Run) -> float | None:
        base = self.baseline.peak_memory_bytes if self.baseline.ok else None
        return _ratio(run.peak_memory_bytes, base)

    def varying_overrides(self, run: Run) -> list[str]:
        """The run's overrides that not every run shares: what sets it apart."""
        return [o for o in run.overrides if o not in self.common_overrides]

    @property
    def not_ok(self) -> list[Run]:
        """Runs that did not finish; an Optuna trial its pruner stopped did (plugins/optuna_trial.py),
        and one whose sweep was killed under it is no failure when another trial ran its values
        again (tuneup/optuna/resume.py)."""
        return [run for run in self.runs if not (run.ok or run.status == "pruned" or run.run_again)]


def is_autotune(runs: list[Run]) -> bool:
    """Whether the runs are an autotune's trials (the sweeper Hydra saved with them)."""
    sweeper = saved_node(runs[0].path, "hydra.yaml", "hydra.sweeper._target_") if runs else None
    return "autotune" in str(sweeper or "")


def pick_baseline(runs: list[Run], wanted: str | None) -> Run:
    """The run named ``wanted`` (a run name or overrides it has); the first run if None."""
    if wanted is None:
        return runs[0]
    by_name = [run for run in runs if run.name == wanted.strip()]
    if by_name:
        return by_name[0]
    asked = {_bare(o) for o in wanted.split()}
    matches = [run for run in runs if asked <= {_bare(o) for o in run.overrides}]
    if len(matches) != 1:
        listing = "; ".join(f"{run.name}: {' '.join(run.overrides) or '-'}" for run in runs)
        found = "no run has" if not matches else f"{len(matches)} runs have"
        raise ReportError(
            f"report.baseline={wanted!r}: {found} these overrides; expected a run name or "
            f"overrides that exactly one run has. Runs: {listing}"
        )
    return matches[0]


def ranked(runs: list[Run], rank_by: str) -> list[Run]:
    """Finished runs first, best ``rank_by`` first; then the others in job order."""

    def key(run: Run):
        if not run.ok:
            return (1, 0.0, 0.0, natural_key(run.name))
        first, second = run.samples_per_s, run.val_acc
        if rank_by == "val_acc":
            first, second = second, first
        return (0, -_number(first), -_number(second), natural_key(run.name))

    return sorted(runs, key=key)


def pick_best(runs: list[Run], baseline: Run, settings: Settings) -> Run | None:
    """The best run by the rule :func:`best_rule` states; None when no run qualifies."""
    finished = [run for run in runs if run.ok]
    if settings.rank_by == "val_acc":
        scored = [run for run in finished if run.val_acc is not None]
        return max(scored, key=lambda r: (r.val_acc, _number(r.samples_per_s)), default=None)
    floor = accuracy_floor(baseline, settings)
    eligible = [
        run
        for run in finished
        if run.samples_per_s is not None
        and (floor is None or (run.val_acc is not None and run.val_acc >= floor))
    ]
    return max(eligible, key=lambda r: r.samples_per_s, default=None)


def accuracy_floor(baseline: Run, settings: Settings) -> float | None:
    """The lowest val acc a run may have to be best; None when the baseline has none."""
    if not baseline.ok or baseline.val_acc is None:
        return None
    return baseline.val_acc - settings.val_acc_tolerance - 1e-12  # 1e-12: float rounding


def best_rule(report: Report) -> str:
    settings = report.settings
    if report.race is not None:
        blocks = report.race.blocks
        decided = f" Decided here by {blocks[0].decided}: {blocks[0].why}." if blocks else ""
        return (
            "best = the configuration (runs that differ only in `seed`) first among those whose "
            "seeds all reached the target (else where the most did): by median time to target "
            "where it is shorter beyond the noise, else by median steps to target; see Time to "
            f"target.{decided}"
        )
    if settings.rank_by == "val_acc":
        return "best = the finished run with the highest val acc."
    if accuracy_floor(report.baseline, settings) is None:
        return "best = the fastest finished run (the baseline has no val acc to compare with)."
    return (
        "best = the fastest finished run whose val acc is at most "
        f"{settings.val_acc_tolerance:g} below the baseline's "
        "(report.val_acc_tolerance)."
    )


def common_overrides(runs: list[Run]) -> list[str]:
    """The overrides every run shares (the table shows each run's others)."""
    if len(runs) < 2:
        return []
    shared = set.intersection(*(set(run.overrides) for run in runs))
    return [o for o in runs[0].overrides if o in shared]


def report_notes(runs: list[Run], directory: Path) -> list[str]:
    """What the reader should know to read the numbers: the interval, memory on CPU, runs
    that shared the machine, runs without a summary."""
    notes = [
        f"speed-up interval: {CONFIDENCE:.0%}, Welch's t over the speed windows of the run and "
        "the baseline (spread: their lowest and highest samples/s). It covers the variation "
        'inside each run only; load that differed between runs is not in it. "within '
        'noise": the interval includes 1.0, no speed-up is shown. For repeats measured '
        "interleaved: experiment=autotune."
    ]
    if any((run.summary or {}).get("accelerator") == "cpu" for run in runs):
        notes.append(
            "On CPU, peak memory is the process's peak resident set size during the run (reset "
            "at its start on Linux), which includes the Python process itself."
        )
    n_jobs = saved_node(runs[0].path, "hydra.yaml", "hydra.launcher.n_jobs")
    sweeper = str(saved_node(runs[0].path, "hydra.yaml", "hydra.sweeper._target_") or "")
    if n_jobs is not None and n_jobs != 1 and "autotune" not in sweeper:  # it runs one at a time
        notes.append(
            f"The runs ran in parallel (hydra.launcher.n_jobs={n_jobs}): they shared the "
            "machine's cores and devices, so their samples/s are lower than alone and "
            "comparable only with each other."
        )
    missing = [run.name for run in runs if run.summary is None]
    if missing:
        notes.append(
            f"Runs {', '.join(missing)} have no summary.json: their process died before the "
            "end (killed, out of memory) or they are still running."
        )
    return notes


def outside_interval_notes(report: Report) -> list[str]:
    """Speed-ups (whole-run samples/s) outside their intervals (the windows' mean log speeds):
    a few windows far slower than the rest (a run paying one-time costs, load that came and
    went) pull a run's samples/s down and the two disagree, so the reader is told which to
    trust rather than shown a ratio its own interval rules out."""
    outside = []
    for run in report.runs:
        ratio, interval = report.speed_up(run), report.speed_up_interval(run)
        if ratio is None or interval is None or interval.low <= ratio <= interval.high:
            continue
        low, high = interval.low, interval.high
        outside.append(f"run {run.name}: {ratio:.2f}x, interval {low:.3g}-{high:.3g}x")
    if not outside:
        return []
    return [
        f"Speed-ups outside their interval ({'; '.join(outside)}): the speed-up is samples/s "
        "over the whole run, the interval comes from the speed windows, and a few windows far "
        "slower than the rest (the spread column), in the run or the baseline, pull samples/s "
        "down. The interval, which weighs every window alike, is the better guide; to be "
        "sure, run them again or compare them interleaved with experiment=autotune."
    ]


def _bare(override: str) -> str:
    """An override without Hydra's ``+``/``++`` prefix, so ``+ablation=all`` matches ``ablation=all``."""
    return override.strip().lstrip("+")


def _ratio(value, base) -> float | None:
    if value is None or not base:
        return None
    return value / base


def _number(value) -> float:
    return float("-inf") if value is None else float(value)
