"""The batch-size dimension: the largest batch that fits, and the learning rate that goes with it.

Fits: a trial's peak memory is at most (1 - ``autotune.memory_headroom``) x the memory the
trial could use (summary.json's ``peak_memory_bytes`` against ``memory_available_bytes``,
plugins/measure/memory.py): on a GPU the caching allocator's peak against the device's memory
(the headroom covers the CUDA context and fragmentation, which the allocator's peak leaves
out); on a CPU the process's peak resident set against its resident memory plus what the
system (or its cgroup) still had free at the fit's start.

How: two short probes (``autotune.probe_steps`` steps, enough for the optimizer's state to
exist) at the recipe's batch b and at 2b give peak = fixed + per_sample x batch; the
largest batch under the limit, a multiple of 8 (tensor-core shapes), at most
``autotune.max_batch_factor`` x b, is then probed itself and lowered by 1/8 while it does
not fit (on a GPU, out of memory is an error of that trial, nothing worse). A CPU never
runs a batch the model says will not fit: there the kernel's out-of-memory killer would
end the whole sweep.

The learning rate (``autotune.lr_rule``): ``linear`` multiplies optimizer.lr by the batch
factor (Goyal et al. 2017, for SGD), ``sqrt`` by its square root (adaptive optimizers,
Hoffer et al. 2017; Malladi et al. 2022), ``keep`` leaves it. An optimizer that scales its
own rate (``optimizer.base_batch_size``, LAMB and LARS here) is left alone. The schedule and
its warm-up are the user's. The accuracy guard then compares the loss at equal samples
seen, so a batch whose rate trains worse per sample is rejected like any other candidate.

Activation checkpointing is tried here, with the larger batch it lets fit, and only when
memory rather than the factor limits the batch: alone it only adds a recomputed forward.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tuneup.autotune.settings import BATCH
from tuneup.autotune.space import Candidate, own_loop

ALIGN = 8
CHECKPOINTING = ("activation_checkpointing=blocks",)


@dataclass(frozen=True)
class MemoryModel:
    """peak memory = fixed + per_sample x batch, from two probes."""

    fixed: float
    per_sample: float

    @classmethod
    def from_probes(cls, small: tuple[int, float], large: tuple[int, float]) -> MemoryModel:
        (b1, p1), (b2, p2) = small, large
        per_sample = max((p2 - p1) / (b2 - b1), 1.0)  # >= 1 byte: a flat line is noise
        return cls(p1 - per_sample * b1, per_sample)

    def largest(self, limit: float) -> int:
        """The largest batch whose predicted peak is within ``limit`` (0 if none)."""
        return max(0, math.floor((limit - self.fixed) / self.per_sample))


def aligned(batch: int) -> int:
    """``batch`` rounded down to a multiple of 8 (at least 8)."""
    return max(ALIGN, batch // ALIGN * ALIGN)


def limit_of(summary: dict, headroom: float) -> float | None:
    """The peak memory a batch may reach, from a trial's summary; None if unknown."""
    available = (summary or {}).get("memory_available_bytes")
    return None if not available else (1 - headroom) * available


def fits(summary: dict | None, limit: float) -> bool:
    peak = (summary or {}).get("peak_memory_bytes")
    return bool(summary) and summary.get("status") == "ok" and peak is not None and peak <= limit


def lr_overrides(cfg, factor: float, rule: str) -> tuple[tuple[str, ...], str]:
    """The learning-rate overrides for a batch ``factor`` times larger, and what they do. A
    LightningModule that builds its own optimizer reads no ``optimizer.*``: its own ``lr``
    argument (``model.lr``) is scaled where the config gives one."""
    key, optimizer = "optimizer.lr", cfg.get("optimizer") or {}
    if own_loop(cfg):
        key, optimizer = "model.lr", {"lr": (cfg.get("model") or {}).get("lr")}
        if optimizer["lr"] is None:
            return (), "lr kept: the LightningModule builds its own optimizer (no model.lr)"
    lr = optimizer.get("lr")
    if optimizer.get("base_batch_size"):
        return (
            (),
            "lr kept: the optimizer scales it to the batch itself (optimizer.base_batch_size)",
        )
    if lr is None or rule == "keep":
        return (), "lr kept (autotune.lr_rule=keep)" if lr is not None else "no optimizer.lr"
    new = lr * (factor if rule == "linear" else math.sqrt(factor))
    how = "linear" if rule == "linear" else "square-root"
    return (f"{key}={new:.6g}",), f"{key} {lr:g} -> {new:.6g} ({how} scaling, x{factor:g} batch)"


def batch_problem(cfg) -> str | None:
    """Why the batch size cannot be searched for this config, or None."""
    batch = (cfg.get("data") or {}).get("batch_size")
    if not isinstance(batch, int) or isinstance(batch, bool):
        return "data.batch_size is not set (the data module makes its own batches)"
    accumulation = cfg.get("grad_accum") or {}
    if accumulation.get("steps") not in (None, 1) or accumulation.get("global_batch_size"):
        return "gradient accumulation is set: the samples per optimizer step are the user's"
    return None


class BatchSearch:
    """The batch-size candidates of one search (tuneup/autotune/speed/search.py): probes, then at
    most two candidates, the largest batch that fits, and with activation checkpointing."""

    def __init__(self, search) -> None:
        self.search, self.settings = search, search.settings
        self.recipe = search.recipe
        self.notes = search.batch_notes

    def candidates(self) -> list[Candidate]:
        config = self.search.checks.inspect(self.recipe).config
        problem = batch_problem(config)
        if problem is None and self.settings.max_batch_factor == 1:
            problem = "autotune.max_batch_factor=1: the batch is kept"
        if problem:
            self.search.not_tried(BATCH, problem)
            return []
        size = config.data.batch_size
        cap = size * self.settings.max_batch_factor
        plain, by_memory = self.largest((), size, cap)
        found = [self.candidate(plain, size, config, ())] if plain else []
        if not by_memory:
            self.notes.append(
                "Activation checkpointing was not tried: autotune.max_batch_factor, not memory, "
                "limits the batch, so it could only add its recomputation."
            )
            return found
        checkpointed, _ = self.largest(CHECKPOINTING, size, cap)
        if checkpointed and checkpointed > (plain or size):
            found.append(self.candidate(checkpointed, size, config, CHECKPOINTING))
        return found

    def candidate(self, batch: int, size: int, config, extra: tuple[str, ...]) -> Candidate:
        lr, how = lr_overrides(config, batch / size, self.settings.lr_rule)
        self.notes.append(f"Batch {batch}{' with ' + extra[0] if extra else ''}: {how}.")
        return Candidate(BATCH, (*extra, f"data.batch_size={batch}", *lr))

    def largest(self, extra: tuple[str, ...], size: int, cap: int) -> tuple[int | None, bool]:
        """(the largest batch above ``size`` that fits, probed, or None; whether memory
        rather than ``cap`` limits it)."""
        what = f" with {' '.join(extra)}" if extra else ""
        probes = [self.probe(extra, batch) for batch in (size, 2 * size)]
        if None in probes:
            return None, False
        limit = limit_of(probes[0].summary, self.settings.memory_headroom)
        if limit is None or not all(fits(p.summary, limit) for p in probes):
            jobs = ", ".join(p.job for p in probes)
            self.notes.append(f"No batch above {size} fits{what} (probes: jobs {jobs}).")
            return None, True
        peaks = [p.figure("peak_memory_bytes") for p in probes]
        model = MemoryModel.from_probes((size, peaks[0]), (2 * size, peaks[1]))
        by_memory = model.largest(limit)
        available = probes[0].figure("memory_available_bytes")
        self.notes.append(
            f"Memory{what}: {model.fixed / 2**20:,.0f} MiB + {model.per_sample / 2**20:.3f} MiB "
            f"per sample (probes of {size} and {2 * size}: jobs {probes[0].job}, {probes[1].job}); "
            f"limit {limit / 2**20:,.0f} MiB of {available / 2**20:,.0f} MiB available "
            f"(autotune.memory_headroom={self.settings.memory_headroom:g}): up to {by_memory} "
            f"would fit; the cap is {cap} (autotune.max_batch_factor={self.settings.max_batch_factor})."
        )
        batch = aligned(min(cap, by_memory))
        for _ in range(3):  # the largest, checked by a probe; lowered by 1/8 while it does not fit
            if batch <= size:
                break
            trial = self.probe(extra, batch)
            if trial is not None and fits(trial.summary, limit):
                return batch, by_memory < cap
            self.notes.append(
                f"Batch {batch}{what} does not fit (job {trial.job if trial else '-'})."
            )
            batch = aligned(batch * 7 // 8)
        return None, by_memory < cap

    def probe(self, extra: tuple[str, ...], batch: int):
        """A short trial at ``batch``, or None when the checks refuse that batch."""
        overrides = (*self.recipe, *extra, f"data.batch_size={batch}")
        inspection = self.search.checks.inspect(overrides)
        if not inspection.ok:
            self.notes.append(
                f"Batch {batch} is refused by the checks: {'; '.join(inspection.problems)}."
            )
            return None
        name = f"probe: {' '.join(overrides)}"
        return self.search.lab.run(name, overrides, steps=self.settings.probe_steps)
