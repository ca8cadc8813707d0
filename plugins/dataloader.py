"""DataLoader workers and pinned memory, chosen by ``dataloader=off|workers``.

With torch's defaults (``dataloader=off``, no plugin) batches are loaded in the
training process: while a JPEG is decoded and augmented the GPU waits, which
the summary's ``data_wait_fraction`` shows. ``workers`` loads them in
``num_workers`` worker processes ahead of time (``prefetch_factor`` batches
each), keeps the workers between epochs (``persistent_workers``) and copies
batches into page-locked memory (``pin_memory``) so the host-to-device copy is
asynchronous. It does so through torch's own DataLoader arguments, set in the
``configure_dataloader`` hook; Lightning seeds each worker
(``seed_everything(workers=True)``).

``num_workers: auto`` is ``min(8, usable CPUs // processes on this node)``:
every training process gets its share of the CPUs the job may use (its
affinity mask, as Slurm sets it), capped at 8 because more rarely helps and
each worker costs memory. ``pin_memory: auto`` pins on CUDA only.
"""

from __future__ import annotations

from tuneup import hookimpl
from tuneup.trainer.environment import Environment, usable_cpus
from tuneup.trainer.validation import Integer, OneOf, problems

#: ``num_workers: auto`` never starts more workers than this per process.
MAX_AUTO_WORKERS = 8


def auto_workers(processes_per_node: int, cpus: int | None = None) -> int:
    """Workers per training process: its share of the CPUs, at most :data:`MAX_AUTO_WORKERS`."""
    cpus = usable_cpus() if cpus is None else cpus
    return min(MAX_AUTO_WORKERS, cpus // max(1, processes_per_node))


def loader_arguments(settings, env: Environment) -> dict:
    """The DataLoader keyword arguments ``settings`` (``cfg.dataloader``) resolve to on ``env``."""
    workers = settings.num_workers
    if workers == "auto":
        workers = auto_workers(env.devices)
    pin = env.is_cuda if settings.pin_memory == "auto" else settings.pin_memory
    arguments = {"num_workers": workers, "pin_memory": pin and env.is_cuda}
    if pin and not env.is_cuda:  # torch would warn and pin nothing: off, and said so
        arguments["pin_memory_off"] = (
            f"pin_memory=true pins for copies to a GPU; none on {env.accelerator}"
        )
    if workers > 0:  # torch rejects these two without workers
        persistent = settings.persistent_workers
        arguments["persistent_workers"] = True if persistent is None else persistent
        if settings.prefetch_factor is not None:
            arguments["prefetch_factor"] = settings.prefetch_factor
    return arguments


def worker_problems(settings) -> list[str]:
    """Settings that only make sense with worker processes, given ``num_workers: 0``."""
    if settings.get("num_workers") != 0:
        return []
    found = []
    if settings.get("persistent_workers"):
        found.append(
            "dataloader.persistent_workers=True needs worker processes, but "
            "dataloader.num_workers=0 loads in the training process; set num_workers "
            "to 1 or more (or auto), or persistent_workers to null"
        )
    if settings.get("prefetch_factor") is not None:
        found.append(
            f"dataloader.prefetch_factor={settings.prefetch_factor} is the batches each worker "
            "loads ahead, but dataloader.num_workers=0 starts no workers; set num_workers to "
            "1 or more (or auto), or prefetch_factor to null"
        )
    return found


RULES = {
    "dataloader.num_workers": Integer(low=0, also=("auto",)),
    "dataloader.pin_memory": OneOf((True, False, "auto")),
    "dataloader.persistent_workers": OneOf((True, False, None)),
    "dataloader.prefetch_factor": Integer(low=1, also=(None,), note="None: torch's default, 2"),
}


class Plugin:
    def __init__(self, cfg) -> None:
        self.settings = cfg.dataloader
        self.arguments: dict | None = None  # resolved when the first DataLoader is made

    @hookimpl
    def check(self, cfg):
        return problems(cfg, RULES) + worker_problems(cfg.dataloader)

    @hookimpl
    def configure_dataloader(self, cfg, kwargs):
        if self.arguments is None:
            self.arguments = loader_arguments(self.settings, Environment.from_config(cfg))
        kwargs.update({k: v for k, v in self.arguments.items() if k != "pin_memory_off"})

    def describe(self):
        settings = {"name": "workers", "usable_cpus": usable_cpus()}
        if self.arguments is not None:
            return {**settings, **self.arguments}
        return {**settings, "num_workers": self.settings.num_workers}
