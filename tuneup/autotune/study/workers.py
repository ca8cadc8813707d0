"""``autotune.workers``: how many study trials run at once, and what each worker has.

The explore stage and the confirmation's seeds run up to ``workers`` jobs at once through the
sweep's launcher (tuneup/optuna/workers.py drives them). Jobs at once must run out of the
sweep's process: the basic launcher runs its jobs in it, one at a time, so ``workers`` > 1
needs a launcher that runs them in processes of their own (``hydra/launcher=joblib
hydra.launcher.n_jobs=N``, or submitit's).

Each worker has its own share of the machine: on a GPU its own device, named by its index
(``trainer.devices=[i]``: Lightning places the run there; not ``CUDA_VISIBLE_DEVICES``,
which a joblib worker process that has already run a job on another device would ignore,
CUDA being set up once per process), on a CPU its share of the cores through the job's
environment (``hydra.job.env_set.OMP_NUM_THREADS``, which Hydra applies around the job and the
run applies to torch: trainer/environment.threads_as_asked). The speed stage's trials are not
the workers': they run one at a time, with the machine to themselves.

Under submitit's Slurm launcher (``hydra/launcher=slurm``) each job is an allocation of its
own on the node Slurm picks, with the devices and cores ``hydra.launcher`` asks for
(``gpus_per_node``, ``cpus_per_task``): the sweeper's machine says nothing of it, so the
workers get no override and no count of the sweeper's devices limits them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from tuneup import TuneupError

log = logging.getLogger(__name__)

ENV = "++hydra.job.env_set"


@dataclass(frozen=True)
class Workers:
    count: int
    cuda: bool  # one device each (else a share of the cores each)
    cpus: int  # the cores the workers share (on a CPU)
    allocated: bool = False  # each job a Slurm allocation of its own: nothing to share out

    def resources(self, slot: int) -> tuple[list[str], str]:
        """(the job's overrides, in words) of worker ``slot``: one worker keeps the machine as
        the user's command has it (no override), as does a job Slurm gives its own devices
        and cores (``hydra.launcher``'s ``gpus_per_node``, ``cpus_per_task``)."""
        if self.count == 1 or self.allocated:
            return [], ""
        if self.cuda:
            return [f"trainer.devices=[{slot}]"], f"GPU {slot}"
        threads = self.threads
        return [f"{ENV}.OMP_NUM_THREADS={threads}"], f"{threads} thread(s)"

    def alone(self) -> tuple[list[str], str]:
        """(overrides, in words) of a run that has the machine to itself (the baseline, the
        speed stage): on a CPU all the cores, stated, since a process that ran a worker's
        job keeps the threads it set (trainer/environment.threads_as_asked)."""
        if self.count == 1 or self.cuda or self.allocated:
            return [], ""
        return [f"{ENV}.OMP_NUM_THREADS={self.cpus}"], ""

    @property
    def threads(self) -> int:
        return max(1, self.cpus // self.count)

    @property
    def shared_cores(self) -> bool:
        """Whether the workers share the cores: then a trial's own step times measure the
        others' load as well as its configuration."""
        return self.count > 1 and not self.cuda and not self.allocated


def resolve(given: int | None, launcher, config) -> Workers:
    """The workers ``autotune.workers`` gives (null: the GPUs a one-device command can have,
    1 on a CPU), checked against what the launcher runs at once; one line when it cannot."""
    from tuneup.optuna.workers import launcher_limit
    from tuneup.trainer.environment import Environment, usable_cpus

    env = Environment.from_config(config)
    cuda = env.is_cuda and env.world_size == 1
    if own_allocations(launcher):  # the sweeper's machine is not the jobs': Slurm places them
        return Workers(given or 1, cuda, usable_cpus(), allocated=True)
    gpus = _gpus() if cuda else 0
    limit, why = launcher_limit(launcher)
    if given is None:
        count = max(1, gpus) if cuda else 1
        if limit is not None and limit < count:
            log.info("autotune: %d GPUs, but %s: %d worker(s)", gpus, why, limit)
            count = max(1, limit)
        return Workers(count, cuda, usable_cpus())
    if given > 1 and limit is not None and limit < given:
        raise TuneupError(
            f"autotune.workers={given} needs {given} jobs at once, but {why}; run them in "
            f"processes of their own: hydra/launcher=joblib hydra.launcher.n_jobs={given}"
        )
    if cuda and given > gpus:
        raise TuneupError(
            f"autotune.workers={given}: each worker has a GPU of its own and this machine "
            f"shows {gpus}; give at most autotune.workers={gpus}"
        )
    return Workers(given, cuda, usable_cpus())


def own_allocations(launcher) -> bool:
    """Whether each job runs in a Slurm allocation of its own (submitit's Slurm launcher)."""
    kind = type(launcher)
    return kind.__name__ == "SlurmLauncher" and kind.__module__.startswith(
        "hydra_plugins.hydra_submitit_launcher"
    )


def _gpus() -> int:
    import torch

    return torch.cuda.device_count()
