"""Inside a Slurm job: ranks from Slurm, and who asks Slurm to run the job again (requeue).

Ranks: Lightning's ``SLURMEnvironment`` reads them from ``SLURM_PROCID``,
``SLURM_LOCALID``, ``SLURM_NODEID`` and ``SLURM_NTASKS`` when Slurm started one task
per device (``srun``, or the submitit launcher's tasks): processes are then created
by Slurm, not by Lightning. The tasks per node must equal ``trainer.devices`` and
the nodes ``trainer.num_nodes``; :func:`task_problems` says so before training.

Requeue has exactly one owner: this module, on global rank 0. Three components
could claim it, and two are switched off:

- Lightning's ``SLURMEnvironment(auto_requeue=True)`` saves an ``hpc_ckpt_*.ckpt``
  from inside its SIGUSR1 handler, mid-step, and requeues. Built here with
  ``auto_requeue=False``: tuneup's checkpoints live in ``<run dir>/checkpoints``
  and are written at optimizer-step boundaries (plugins/checkpoint/saver.py).
- submitit requeues on its own signal (``SUBMITIT_PREEMPT_SIGNAL``, USR2 by
  default) and exits at once, without a training checkpoint. conf/hydra/launcher/
  slurm.yaml asks Slurm for USR1 instead, so submitit's handler never fires.
- tuneup: SIGUSR1 (``--signal=USR1@<lead seconds>``) makes the checkpoint plugin
  finish the optimizer step, save, and stop (:class:`trainer.preemption.Preempted`,
  exit code 75). Rank 0 then requeues the job as its process exits
  (:func:`requeue_at_exit`), after its checkpoint and ``summary.json`` are on disk,
  because ``scontrol requeue`` makes Slurm signal the job's processes.

Only SIGUSR1 requeues. SIGTERM also saves and stops, but it is how ``scancel``
ends a job (requeueing would undo the cancel) and how Slurm preempts with its own
``PreemptMode=REQUEUE``. The requeued job runs the same batch script with the same
job id; ``hydra.run.dir`` (conf/config.yaml) and the submitit launcher's pickled
sweep directory are the same as before, so ``resume=auto`` finds the checkpoint.
"""

from __future__ import annotations

import atexit
import logging
import os
import subprocess

from lightning_fabric.plugins.environments import SLURMEnvironment

log = logging.getLogger(__name__)

#: The signal that asks for save-stop-requeue (``--signal=USR1@<seconds>``).
REQUEUE_SIGNAL = "SIGUSR1"


def in_slurm_job() -> bool:
    """True when Slurm started this process as a task of a batch job.

    Lightning's test (``SLURMEnvironment.detect``) without its warning about an
    unused ``srun``, which it gives on any machine that has Slurm installed.
    """
    return "SLURM_NTASKS" in os.environ and os.environ.get("SLURM_JOB_NAME") not in (
        "bash",
        "interactive",
    )


def cluster_environment() -> SLURMEnvironment | None:
    """Lightning's Slurm environment without its auto-requeue, or None outside Slurm."""
    return SLURMEnvironment(auto_requeue=False) if in_slurm_job() else None


def task_problems(devices: int, num_nodes: int) -> list[str]:
    """Mismatches between the Slurm allocation's tasks and the Trainer's processes."""
    if not in_slurm_job():
        return []
    found = []
    per_node = os.environ.get("SLURM_NTASKS_PER_NODE", "").split("(")[0]
    nodes = os.environ.get("SLURM_NNODES") or os.environ.get("SLURM_JOB_NUM_NODES")
    if per_node.isdigit() and int(per_node) != devices:
        found.append(
            f"trainer.devices={devices} but this Slurm job runs {per_node} task(s) per node: "
            f"Slurm starts one process per device, so set trainer.devices={per_node} or "
            f"submit with --ntasks-per-node={devices} (hydra.launcher.tasks_per_node)"
        )
    if nodes and nodes.isdigit() and int(nodes) != num_nodes:
        found.append(
            f"trainer.num_nodes={num_nodes} but this Slurm job has {nodes} node(s): set "
            f"trainer.num_nodes={nodes} or submit with --nodes={num_nodes}"
        )
    return found


#: Variables a multi-node launch sets on each node: Lightning's manual one (NODE_RANK,
#: MASTER_ADDR), torchrun's, MPI's, LSF's. Slurm is :func:`in_slurm_job`.
NODE_LAUNCH_VARIABLES = (
    "NODE_RANK",
    "MASTER_ADDR",
    "GROUP_RANK",
    "TORCHELASTIC_RUN_ID",
    "OMPI_COMM_WORLD_SIZE",
    "LSB_JOBID",
)


def lone_node_problems(num_nodes: int) -> list[str]:
    """``trainer.num_nodes`` above 1 where nothing started the other nodes' processes: the
    rendezvous would wait for them, then fail with a timeout, a minute or more later."""
    if num_nodes <= 1 or in_slurm_job() or any(v in os.environ for v in NODE_LAUNCH_VARIABLES):
        return []
    return [
        f"trainer.num_nodes={num_nodes}, but no cluster started this command on each node (no "
        "Slurm job, no NODE_RANK and MASTER_ADDR): alone it would wait for the other nodes and "
        "time out; allowed here: trainer.num_nodes=1, or start it with srun, "
        "hydra/launcher=slurm, or NODE_RANK and MASTER_ADDR set on each node (docs/slurm.md)"
    ]


def job_id() -> str:
    """The id ``scontrol requeue`` needs: ``<array job>_<task>`` for an array element."""
    array_job = os.environ.get("SLURM_ARRAY_JOB_ID")
    if array_job is not None:
        return f"{array_job}_{os.environ['SLURM_ARRAY_TASK_ID']}"
    return os.environ["SLURM_JOB_ID"]


def requeue(job: str) -> bool:
    """Ask Slurm to run ``job`` again; False (logged) when it refuses."""
    result = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True)
    if result.returncode:
        log.error("scontrol requeue %s failed: %s", job, result.stderr.strip())
        return False
    log.warning("requeued Slurm job %s: it will continue with resume=auto", job)
    return True


def requeue_at_exit() -> str:
    """Requeue this job when the process exits (after the summary is written); returns its id."""
    job = job_id()
    atexit.register(requeue, job)
    return job
