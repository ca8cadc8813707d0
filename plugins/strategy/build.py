"""Lightning's DDP and model-parallel strategies, built from ``cfg.strategy``, and what
Lightning leaves out.

Two subclasses fill the gaps:

- :class:`DDP` registers the gradient communication hook on every device.
  Lightning's ``DDPStrategy._register_ddp_hooks`` registers ``ddp_comm_hook`` only
  on CUDA (a torch 1.8 limitation); torch's hooks run on gloo/CPU too, so
  ``comm_hook=fp16`` means the same on both and is tested here.
- :class:`ModelParallel` (``strategy=fsdp``): Lightning's ``ModelParallelStrategy``
  (FSDP2 and tensor parallelism on a 2-D device mesh) applied to any ``nn.Module``.
  Lightning's FSDP1 ``FSDPStrategy`` is not offered: torch deprecates FSDP1 for FSDP2,
  and it never ran here (CUDA only, whole-model wrapping by policy).
- Both start local ranks > 0 as the same Hydra job (:mod:`plugins.strategy.launch`).

The backend follows the accelerator: NCCL on CUDA, gloo on CPU. The collective
``timeout`` is short (``strategy.timeout_s``, 60 s by default, torch's default is
30 minutes): a rank that hangs makes the others fail with an error in a minute.
Joining at the start has its own, long one (``strategy.join_timeout_s``, 30 minutes):
processes start unevenly (:mod:`plugins.strategy.join`). A rank that dies is noticed
sooner: gloo/NCCL report the closed connection, and Lightning's launcher kills every
local process when one exits with an error; when rank 0 fails, it ends the local ranks it
started (:mod:`plugins.strategy.launch`).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from lightning_fabric.utilities.seed import reset_seed
from pytorch_lightning.strategies import DDPStrategy, ModelParallelStrategy
from pytorch_lightning.strategies.parallel import ParallelStrategy
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from tuneup.plugins.strategy.join import DEFAULT_JOIN_S, connect
from tuneup.plugins.strategy.launch import HydraJobLauncher
from tuneup.plugins.strategy.materialize import materialize
from tuneup.plugins.strategy.parallelize import Layout, Settings, parallelize
from tuneup.trainer.state.changes import adopt_group, group_settings

#: ``strategy.comm_hook`` -> torch's hook (None: DDP's built-in all-reduce of fp32 buckets).
COMM_HOOKS = {
    "none": None,
    "fp16": default_hooks.fp16_compress_hook,
    "bf16": default_hooks.bf16_compress_hook,
}


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

    def __init__(
        self,
        *args,
        allreduce_count: AllReduceCount | None = None,
        join_timeout_s: float = DEFAULT_JOIN_S,
        **kwargs,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.join_timeout_s = join_timeout_s
        if allreduce_count is not None:
            self._ddp_comm_hook = allreduce_count.wrap(self._ddp_comm_hook)

    def setup_distributed(self) -> None:  # Lightning's, with a join timeout of its own
        reset_seed()
        self.set_world_ranks()
        self._process_group_backend = self._get_process_group_backend()
        connect(self, self.join_timeout_s)

    def _configure_launcher(self) -> None:
        super()._configure_launcher()
        if self._start_method == "popen":
            self._launcher = HydraJobLauncher(
                self.cluster_environment, self.num_processes, self.num_nodes
            )

    def _register_ddp_hooks(self) -> None:
        if self._ddp_comm_hook is not None:
            self.model.register_comm_hook(self._ddp_comm_state, self._ddp_comm_hook)


class ModelParallel(ModelParallelStrategy):
    """Lightning's ``ModelParallelStrategy`` (FSDP2 + tensor parallelism on a 2-D mesh), plus:

    - the model parallelised by tuneup (:func:`plugins.strategy.parallelize.parallelize`)
      when the strategy sets up, so the user's plain ``nn.Module`` needs no
      ``configure_model`` of its own (a user's LightningModule keeps its own); a model built
      empty is then materialised shard by shard (:mod:`plugins.strategy.materialize`);
    - no gradient reduce-scatter on the micro-batches of an accumulation window before
      its last (FSDP2's ``set_requires_gradient_sync(False)``; Lightning blocks sync only
      for DDP): gradients then accumulate unsharded until the window ends;
    - the data shard of a process is its data-parallel rank (the processes of one
      tensor-parallel group see the same samples);
    - sharded checkpoints written atomically with a checksum per file
      (:mod:`tuneup.trainer.state.sharded`);
    - Hydra-job children (:mod:`plugins.strategy.launch`).
    """

    def __init__(
        self,
        *args,
        settings: Settings | None = None,
        join_timeout_s: float = DEFAULT_JOIN_S,
        **kwargs,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.join_timeout_s = join_timeout_s
        #: What parallelize does (plugins/strategy/fsdp.py); the precision plugin sets its
        #: param_dtype (FSDP2's mixed precision) in configure_trainer.
        self.settings = settings or Settings()
        self.layout: Layout | None = None

    def _configure_launcher(self) -> None:
        # Always, as DDPStrategy does (Lightning's sets one only where no one else starts the
        # processes): whether to start children is decided in launch(), after the previous job
        # of a sweep is forgotten; its LOCAL_RANK would otherwise leave the next job alone.
        self._launcher = HydraJobLauncher(
            self.cluster_environment, self.num_processes, self.num_nodes
        )

    def _setup_distributed(self) -> None:  # Lightning's, with a join timeout of its own
        ParallelStrategy.setup_environment(self)
        reset_seed()
        self.set_world_ranks()
        self._process_group_backend = self._get_process_group_backend()
        connect(self, self.join_timeout_s)

    def data_shard(self) -> tuple[int, int]:
        """(data-parallel rank, size): the mesh is (data_parallel, tensor_parallel), row-major."""
        tp = self._tensor_parallel_size
        return self.global_rank // tp, max(1, self.world_size // tp)

    def setup(self, trainer) -> None:
        module = self.lightning_module
        if self.layout is None and isinstance(getattr(module, "model", None), nn.Module):
            self.layout = parallelize(module.model, self.device_mesh, self.settings)
            s = self.settings  # a model built empty gets its values now, shard by shard
            self.layout.init = materialize(
                module.model, self.root_device, s.init, s.seed, s.weights, s.build
            )
        super().setup(trainer)

    @contextmanager
    def block_backward_sync(self):
        roots = fsdp_roots(self.model)
        for root in roots:
            root.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            for root in roots:
                root.set_requires_gradient_sync(True)

    def save_checkpoint(self, checkpoint, filepath, storage_options=None) -> None:
        if not self._save_distributed_checkpoint:
            return super().save_checkpoint(checkpoint, filepath, storage_options)
        from tuneup.trainer.state import sharded

        sharded.save(self, checkpoint, Path(self.broadcast(str(filepath))))

    def load_checkpoint(self, checkpoint_path, weights_only=None) -> dict:
        from tuneup.trainer.state import sharded

        path = Path(self.broadcast(str(checkpoint_path)))
        if path.is_dir():
            sharded.verify(path)
        # Lightning restores the optimizers here, in place, with the saved settings (the
        # single-file path adopts this run's in the checkpoint dict: trainer/state/changes.py)
        fresh = [[group_settings(o, g) for g in o.param_groups] for o in self.optimizers]
        metadata = super().load_checkpoint(path, weights_only=weights_only)
        if path.is_dir():  # plugin state shaped like the model (ema=on): in this run's layout
            sharded.load_plugin_shards(path, metadata, self.model)
        for optimizer, groups in zip(self.optimizers, fresh, strict=True):
            for restored, new in zip(optimizer.param_groups, groups, strict=False):
                adopt_group(restored, new)
        return metadata


def fsdp_roots(module) -> list:
    """The outermost FSDP2 modules in ``module`` (those whose settings reach the others)."""
    from torch.distributed.fsdp import FSDPModule

    found: list = []
    for name, m in module.named_modules():
        if isinstance(m, FSDPModule) and not any(
            name.startswith(f"{r}.") or r == "" for r, _ in found
        ):
            found.append((name, m))
    return [m for _, m in found]


def common(settings, accelerator: str, environment) -> dict:
    return {
        "process_group_backend": backend(accelerator),
        "timeout": timedelta(seconds=settings.timeout_s),
        "join_timeout_s": settings.get("join_timeout_s", DEFAULT_JOIN_S),
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


def model_parallel_strategy(
    settings, accelerator: str, world_size: int, parallel: Settings, environment=None
) -> ModelParallel:
    """A :class:`ModelParallel` for ``strategy=fsdp``: the tensor-parallel size from
    ``settings``, the rest of the world data-parallel."""
    tp = settings.get("tensor_parallel_size", 1)
    options = common(settings, accelerator, environment)
    environment = options.pop("cluster_environment")  # not an argument of this strategy
    strategy = ModelParallel(
        **options,
        data_parallel_size=world_size // tp,
        tensor_parallel_size=tp,
        save_distributed_checkpoint=settings.get("checkpoint", "sharded") == "sharded",
        settings=parallel,
    )
    if environment is not None:
        strategy.cluster_environment = environment
    return strategy
