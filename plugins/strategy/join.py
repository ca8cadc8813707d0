"""How the processes of a run meet: two timeouts, one for joining, one for each collective.

torch's ``init_process_group`` uses one ``timeout`` for both: the rendezvous (rank 0's
TCPStore waits for every process to connect; the others retry connecting to it) and every
collective afterwards. Lightning passes the strategy's ``timeout`` there. So the short
collective timeout that makes a hung rank fail the run in a minute (``strategy.timeout_s``)
also bounded the start: a rank still importing torch after 60 s on a loaded machine (or a
node whose container is still pulling, whose file system is cold) failed the run with
``DistStoreError: Timed out after 61 seconds waiting for clients. 1/2 clients joined.``

:func:`connect` splits them, as torchrun does (its rendezvous ``join_timeout`` is separate
from the process group's): torch's own ``env://`` rendezvous with
``strategy.join_timeout_s`` (default 30 minutes, torch's process-group default), then the
process group on that store with ``strategy.timeout_s``. A rendezvous that times out is a
:class:`TuneupError` naming the setting. It costs nothing more at a normal start: the same
store, made by the same torch function, is made once either way.
"""

from __future__ import annotations

import atexit
import os
import re
from datetime import timedelta

import torch.distributed as dist
from lightning_fabric.utilities.distributed import _destroy_dist_connection

from tuneup import TuneupError

#: ``strategy.join_timeout_s`` when a config has none (a strategy node written before it).
DEFAULT_JOIN_S = 1800


def connect(strategy, join_s: float) -> None:
    """Lightning's ``_init_dist_connection`` for ``strategy`` (its cluster environment,
    backend, ``_timeout`` for collectives), with ``join_s`` seconds for every process to join."""
    if dist.is_initialized():
        return
    environment = strategy.cluster_environment
    rank, world = environment.global_rank(), environment.world_size()
    os.environ["MASTER_ADDR"] = environment.main_address
    os.environ["MASTER_PORT"] = str(environment.main_port)
    try:  # env:// as init_process_group does it (torchrun's agent store included)
        store, _, _ = next(
            dist.rendezvous("env://", rank, world, timeout=timedelta(seconds=join_s))
        )
    except dist.DistError as exc:
        if "timed out" not in str(exc).lower():
            raise
        raise TuneupError(not_joined(str(exc), rank, world, join_s)) from exc
    store.set_timeout(strategy._timeout)
    device = strategy.root_device
    dist.init_process_group(
        strategy._process_group_backend,
        store=store,
        rank=rank,
        world_size=world,
        timeout=strategy._timeout,
        device_id=device if device.type != "cpu" else None,
    )
    if strategy._process_group_backend == "nccl":  # as Lightning does: torch warns otherwise
        atexit.register(_destroy_dist_connection)


def not_joined(message: str, rank: int, world: int, join_s: float) -> str:
    """The one line for a rendezvous that timed out: who joined (rank 0 knows), the setting."""
    joined = re.search(r"(\d+)/(\d+) clients joined", message)
    if rank == 0:
        who = f"{joined[1]} of {joined[2]} processes" if joined else f"not all {world} processes"
        who += " joined"
        why = "the others were still starting (importing, loading) or did not start"
    else:
        who = f"process {rank} of {world} could not reach rank 0"
        why = f"rank 0 did not start or has ended ({message.strip().splitlines()[0]})"
    return (
        f"{who} within strategy.join_timeout_s={join_s:g} s: {why}. Raise "
        "strategy.join_timeout_s where processes start slowly (a loaded machine, a cold file "
        "system, a container still pulling); strategy.timeout_s bounds each collective once "
        "they have joined"
    )
