"""Between the loader and the model, chosen by ``data_path=auto|sync``: the prefetcher, and what
the summary says about the data path.

``auto`` (the default): on CUDA the data module stages the next batch (its host-to-device
copy and the data set's device work: for the zoo's images uint8 to normalised float) on a
side CUDA stream while the current step computes, one batch ahead
(trainer/datamodule.py, ``PrefetchLoader``); on a CPU there is nothing to overlap.
``sync``: every batch is copied when the loop asks for it, on the loop's stream, to
measure what the prefetcher buys. ``data_path.prefetch=true`` stages ahead on a CPU too,
where it only reorders work (the tests check resume with it).

Either way the summary gets ``data_path``: what ran where (worker, device), the loader's
workers, pinning and prefetching, and for image folders the images each worker decodes
per second; and, when the loop waited for data more than 10 % of its time,
``data_advice``: how long, and the levers in the order to pull them (:func:`data_advice`).
The work itself is the data module's; this plugin asks for the prefetch through the
``configure_dataloader`` kwargs and reads the data module at the report.
"""

from __future__ import annotations

from tuneup import hookimpl
from tuneup.trainer.datamodule import PREFETCH
from tuneup.trainer.environment import cpus_per_process, usable_cpus
from tuneup.trainer.validation import OneOf, problems

#: Above this share of the loop's time spent waiting for data, the summary gives advice.
WAIT_LIMIT = 0.10

RULES = {"data_path.prefetch": OneOf(("auto", True, False))}


def data_advice(
    wait: float | None, samples_per_s: float | None, path: dict, cpus: int, cuda: bool
) -> str | None:
    """What the summary says when the loop waited for data more than :data:`WAIT_LIMIT`, or None.

    ``wait`` is the summary's data_wait_fraction, ``path`` the data module's description
    (its ``data_path``), ``cpus`` the CPUs this training process may use.
    """
    if wait is None or wait <= WAIT_LIMIT:
        return None
    levers = data_levers(wait, samples_per_s, path, cpus, cuda)
    numbered = " ".join(f"({i}) {lever}." for i, lever in enumerate(levers, 1))
    return (
        f"data_wait_fraction={wait:.2f}: the loop waited for data {wait:.0%} of its time "
        f"(above {WAIT_LIMIT:.0%}), so the data path, not the model, sets this run's speed. "
        f"{numbered}"
    )


def data_levers(wait: float, samples_per_s, path: dict, cpus: int, cuda: bool) -> list[str]:
    """The levers that apply, in the order to pull them: load in parallel, move per-batch work
    to the device, make the per-image work cheaper, overlap the copy."""
    levers = []
    workers = path.get("num_workers") or 0
    if workers == 0:
        levers.append(
            f"load in worker processes: dataloader=workers (num_workers=auto: up to "
            f"{cpus} for this process's {cpus} CPUs)"
        )
    elif workers < cpus:
        levers.append(
            f"more workers: dataloader.num_workers={cpus} (now {workers}; this "
            f"process may use {cpus} CPUs)"
        )
    if path.get("batches") == "float32":
        levers.append(
            "preprocess on the device: data.preprocess=device (uint8 batches, a quarter "
            "of the bytes; the GPU flips and normalises)"
        )
    if (lever := _decode_lever(wait, samples_per_s, path, workers)) is not None:
        levers.append(lever)
    if cuda and not path.get("pin_memory"):
        levers.append(
            "pin the batches, so copies run asynchronously: dataloader=workers, or "
            "dataloader.pin_memory=true"
        )
    if cuda and path.get("prefetch") == "off":  # not asked for (data_path=sync)
        levers.append("overlap the copy with the step: data_path=auto")
    if not levers:
        levers.append(
            "find the slow part: profiler=on shows the loader's time; with more CPUs "
            "per GPU the workers can keep up"
        )
    return levers


def _decode_lever(wait: float, samples_per_s, path: dict, workers: int) -> str | None:
    """Decoding named as the bottleneck when the workers' decode rate is below what the model
    could take (its speed had it not waited)."""
    rate = path.get("decode_images_per_s_per_worker")
    if not rate or not samples_per_s:
        return None
    capacity, wanted = rate * max(1, workers), samples_per_s / max(1e-9, 1 - wait)
    if capacity >= wanted:
        return None
    return (
        f"decoding is the bottleneck: {rate:.0f} images/s per worker x {max(1, workers)} = "
        f"{capacity:.0f}/s, the model could take about {wanted:.0f}/s; decode cheaper: "
        "data.decoder=simplejpeg or nvjpeg (on the GPU), data.draft=true, or store the "
        "images smaller (shorter side near data.image_size / data.val_crop_fraction)"
    )


def resolve_prefetch(setting, cuda: bool) -> bool:
    """``auto``: prefetch on CUDA only (a CPU has no copy to overlap)."""
    return cuda if setting == "auto" else bool(setting)


class Plugin:
    def __init__(self, cfg) -> None:
        self.settings = cfg.data_path
        self.data = None  # the run's data module, known at check
        self.prefetch = False
        self.cuda = False
        self.cpus = usable_cpus()

    @hookimpl
    def check(self, cfg, env, plan):
        found = problems(cfg, RULES)
        self.cuda = env.is_cuda
        self.cpus = cpus_per_process(env.devices)
        self.prefetch = resolve_prefetch(self.settings.get("prefetch", "auto"), env.is_cuda)
        if plan.sound:
            self.data = plan.data
        return found

    @hookimpl
    def configure_dataloader(self, kwargs):
        kwargs[PREFETCH] = self.prefetch

    @hookimpl(trylast=True)  # after the measure plugin's report: it needs data_wait_fraction
    def report(self, summary):
        if self.data is None:
            return
        path = self.data.describe()
        summary["data_path"] = path
        wait, speed = summary.get("data_wait_fraction"), summary.get("samples_per_s")
        advice = data_advice(wait, speed, path, self.cpus, self.cuda)
        if advice:
            summary["data_advice"] = advice

    def describe(self):
        return {"name": self.settings.get("name"), "prefetch": self.prefetch}
