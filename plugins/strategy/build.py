"""Lightning's DDP and FSDP strategies, built from ``cfg.strategy``, and what Lightning leaves out.

Two subclasses fill the gaps, nothing else is changed:

- :class:`DDP` registers the gradient communication hook on every device.
  Lightning's ``DDPStrategy._register_ddp_hooks`` registers ``ddp_comm_hook`` only
  on CUDA (a torch 1.8 limitation); torch's hooks run on gloo/CPU too, so
  ``comm_hook=fp16`` means the same on both and is tested here.
- Both start local ranks > 0 as the same Hydra job (:mod:`plugins.strategy.launch`).

The backend follows the accelerator: NCCL on CUDA, gloo on CPU. The collective
``timeout`` is short (``strategy.timeout_s``, 60 s by default, torch's default is
30 minutes): a rank that hangs makes the others fail with an error in a minute.
A rank that dies is noticed sooner: gloo/NCCL report the closed connection, and
Lightning's launcher kills every local process when one exits with an error.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from pytorch_lightning.strategies import DDPStrategy, FSDPStrategy
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from tuneup.plugins.strategy.launch import HydraJobLauncher

#: ``strategy.comm_hook`` -> torch's hook (None: DDP's built-in all-reduce of fp32 buckets).
COMM_HOOKS = {
    "none": None,
    "fp16": default_hooks.fp16_compress_hook,
    "bf16": default_hooks.bf16_compress_hook,
}
SHARDING = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD")


def backend(accelerator: str) -> str:
    return "nccl" if accelerator == "cuda" else "gloo"


@dataclass
class AllReduceCount:
    """Gradient all-reduces DDP made: ``rounds`` (backward passes that synchronised) and buckets."""

    rounds: int = 0
    buckets: int = 0

    def wrap(self, hook):
        """``hook`` (or DDP's default all-reduce) counting each call; bucket 0 starts a round."""
        hook = hook or default_hooks.allreduce_hook

        def counted(state, bucket):
            self.rounds += bucket.index() == 0
            self.buckets += 1
            return hook(state, bucket)

        return counted


class DDP(DDPStrategy):
    """Lightning's ``DDPStrategy`` + hooks on every device + Hydra-job children."""

    def __init__(self, *args, allreduce_count: AllReduceCount | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if allreduce_count is not None:
            self._ddp_comm_hook = allreduce_count.wrap(self._ddp_comm_hook)

    def _configure_launcher(self) -> None:
        super()._configure_launcher()
        if self._start_method == "popen":
            self._launcher = HydraJobLauncher(self.cluster_environment, self.num_processes,
                                              self.num_nodes)  # fmt: skip

    def _register_ddp_hooks(self) -> None:
        if self._ddp_comm_hook is not None:
            self.model.register_comm_hook(self._ddp_comm_state, self._ddp_comm_hook)


class FSDP(FSDPStrategy):
    """Lightning's ``FSDPStrategy`` + Hydra-job children + checkpointing of chosen blocks.

    ``block_types`` selects blocks as activation_checkpointing=blocks does
    (:func:`plugins.activation_checkpointing.select_blocks`: outermost modules of
    those classes, every n-th); FSDP's own checkpoint wrapper applies them after
    sharding, which is what FSDP needs.
    """

    def __init__(self, *args, block_types=(), every_n: int = 1, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.block_types, self.every_n = list(block_types), every_n

    def _configure_launcher(self) -> None:
        super()._configure_launcher()
        if self._launcher is not None:
            self._launcher = HydraJobLauncher(self.cluster_environment, self.num_processes,
                                              self.num_nodes)  # fmt: skip

    def _setup_model(self, model):
        if self.block_types:
            blocks = checkpointed_blocks(model, self.block_types, self.every_n)
            self._activation_checkpointing_kwargs = {"check_fn": lambda m: id(m) in blocks}
        return super()._setup_model(model)


def checkpointed_blocks(model, block_types, every_n: int = 1) -> set[int]:
    """ids of the modules FSDP checkpoints: the activation_checkpointing plugin's selection."""
    from tuneup.plugins.activation_checkpointing import select_blocks

    return {id(model.get_submodule(name)) for name in select_blocks(model, block_types, every_n)}


def common(settings, accelerator: str, environment) -> dict:
    return {
        "process_group_backend": backend(accelerator),
        "timeout": timedelta(seconds=settings.timeout_s),
        "cluster_environment": environment,
    }


def ddp_strategy(settings, accelerator: str, environment=None, count: AllReduceCount | None = None):
    """A :class:`DDP` with the options of ``settings`` (the ``strategy`` config node)."""
    return DDP(
        **common(settings, accelerator, environment),
        ddp_comm_hook=COMM_HOOKS[settings.get("comm_hook", "none")],
        allreduce_count=count,
        find_unused_parameters=settings.get("find_unused_parameters", False),
        static_graph=settings.get("static_graph", False),
        gradient_as_bucket_view=settings.get("gradient_as_bucket_view", False),
        bucket_cap_mb=settings.get("bucket_cap_mb", 25),
    )


def fsdp_strategy(settings, accelerator: str, environment=None):
    """An :class:`FSDP` with the options of ``settings``."""
    return FSDP(
        **common(settings, accelerator, environment),
        sharding_strategy=settings.sharding_strategy,
        cpu_offload=settings.cpu_offload,
        block_types=settings.get("activation_checkpointing") or (),
        every_n=settings.get("activation_checkpointing_every_n", 1),
    )
