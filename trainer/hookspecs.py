"""Every hook a tuneup plugin can implement, in the order the run reaches them.

A run of ``python run.py ...`` goes through these phases; each hook is shown
where it fires::

    compose config (Hydra)
    load plugins: those config nodes name (plugin: <name>), always-on installed ones
    plan what is trained: model and data, the zoo's or the user's (_target_)
    check(cfg, env, plan)                -> all problems shown together, then stop
    build data, model
    configure_model(cfg, model)          pipeline, ordered by tryfirst/trylast:
                                         kernel swaps -> activation checkpointing
                                         -> memory format -> compile
    configure_trainer(cfg, kwargs)       mutate the pl.Trainer keyword arguments
    trainer.fit(...)
        (strategy=fsdp: the processes and their device mesh exist now; the strategy applies
         tensor parallelism, compiles each block if compile=on, and shards the blocks and
         the root with FSDP2: plugins/strategy/parallelize.py. Not a hook.)
        configure_param_groups(cfg, params, model)  pipeline: parameters -> optimizer groups
        configure_optimizer(cfg, params, trainer)   first non-None result wins
        configure_dataloader(cfg, kwargs)    the training DataLoader's arguments
        on_fit_start(cfg, trainer, module)
        configure_dataloader(cfg, kwargs)    the validation DataLoader's arguments
        on_run_accepted(cfg, trainer, module)   training starts (mode=validate|test|predict:
                                             before the evaluation); nothing is written before
        for each training batch:
            transform_batch(cfg, batch)  pipeline, after the device transfer
            on_train_batch_start(cfg, trainer, module, batch, batch_idx)
            forward, loss
            on_before_backward(cfg, trainer, module, loss)
            backward
            on_after_backward(cfg, trainer, module)
            on_before_optimizer_step(cfg, trainer, module, optimizer)   (per optimizer step)
            optimizer step
            on_train_batch_end(cfg, trainer, module, outputs, batch, batch_idx)
        at each validation:
            on_validation_start(cfg, trainer, module)
            transform_batch(cfg, batch) for each validation batch, forward, metrics
            on_validation_end(cfg, trainer, module)
        on_save_checkpoint(cfg, trainer, module, checkpoint) / on_load_checkpoint(...)
        on_exception(cfg, trainer, module, exception)   if anything raised
        on_fit_end(cfg, trainer, module)
    report(cfg, summary)                 add figures; summary.json is written after

Implementations may accept any subset of a hook's arguments (pluggy passes
only the names they ask for), so specs can grow without breaking plugins.

Besides hooks, a plugin object may define these plain methods, which the host
calls on that one plugin (they are per-plugin, so they are not hooks):

``describe() -> dict``
    The plugin's effective settings for the run summary and ``plugins.list``
    (for example which half type ``amp`` chose). Default: the plugin's config node.
``state_dict() -> dict`` / ``load_state_dict(state)``
    Plugin state stored in the Lightning checkpoint under
    ``checkpoint["tuneup"][<plugin name>]`` and handed back on resume. Use only
    tensors and plain Python containers.
"""

from __future__ import annotations

import pluggy

#: The name plugins are known by: pluggy's project, the entry-point group, the config package.
PROJECT = "tuneup"
hookspec = pluggy.HookspecMarker(PROJECT)

# --------------------------------------------------------------------------------------
# check: before anything is built
# --------------------------------------------------------------------------------------


@hookspec
def check(cfg, env, plan) -> list[str]:
    """Return problems with the config or the machine (empty list or None: none).

    ``env`` is a :class:`tuneup.trainer.environment.Environment` describing the
    accelerator the run will use. ``plan`` is a :class:`tuneup.trainer.components.Plan`:
    what the run will train, known before anything real is built. Ask it only when
    ``plan.sound`` (else the core reports what is wrong with the model or the data):
    ``plan.meta_model()`` (the model on the meta device, or None), ``plan.input_shape``,
    ``plan.lightning`` (the user's own LightningModule, trained as it is),
    ``plan.task`` (how the loss is computed), ``plan.model_name``, ``plan.data_name``.
    Every plugin is asked; all problems are shown together in one error before a
    model is built or a process spawned. Every plugin was constructed before (its
    ``__init__(cfg)`` runs when the run loads its plugins): an ``__init__`` that parses or
    converts a setting fails on a bad value before ``check`` can name it; leave that to
    ``check`` and the hooks after it. Each problem should say what is wrong,
    what is allowed and what to do. A plugin that cannot apply to what is trained
    (e.g. a loss kernel on a model that computes its own loss) says so here, never
    skips silently.
    """


# --------------------------------------------------------------------------------------
# setup: build the pieces of the run
# --------------------------------------------------------------------------------------


@hookspec
def configure_model(cfg, model):
    """Change ``model`` (a ``torch.nn.Module``) in place, or return a replacement.

    A pipeline: implementations run one after another in pluggy's call order
    (declare it with ``tryfirst``/``trylast``), each receiving the model the
    previous one produced; returning None keeps the model it was given.
    Convention: kernel swaps ``tryfirst``, ``torch.compile`` ``trylast``.
    Transforms in between must commute (activation checkpointing wraps each
    block's forward in place and channels_last converts parameters in place,
    so either order gives the same model; tests/test_activation_checkpointing.py
    checks both).
    """


@hookspec
def configure_dataloader(cfg, kwargs: dict):
    """Mutate ``kwargs``, the keyword arguments of a ``torch.utils.data.DataLoader`` about to be made.

    Fires each time a data module makes a DataLoader, which is when Lightning asks
    for one inside ``trainer.fit``: the training loader just before
    ``on_fit_start``, the validation loader just after it. ``kwargs`` holds ``dataset``,
    ``batch_size``, ``drop_last`` and ``generator``; the training loader's also ``sampler``,
    the seeded order that resumes mid-epoch (:mod:`trainer.sampling`; do not set ``shuffle``). Add
    ``num_workers``, ``pin_memory``, ``persistent_workers``, ``prefetch_factor``...
    Return value is ignored.
    """


@hookspec
def configure_param_groups(cfg, params, model):
    """Return ``params`` as optimizer parameter groups, or None to keep them as they are.

    A pipeline like ``configure_model``, just before ``configure_optimizer``: ``params`` is the
    model's trainable parameters (a list of tensors), or the groups an earlier implementation
    made (a list of dicts, each ``{"params": [...], <option>: <value>}``: the option overrides
    the optimizer's default for that group, e.g. ``weight_decay``). ``model`` is the network
    that holds them, as it trains (under ``strategy=fsdp`` its parameters are DTensors). Every
    optimizer, the core's and a plugin's, is built from the result.
    """


@hookspec(firstresult=True)
def configure_optimizer(cfg, params, trainer):
    """Return a ``torch.optim.Optimizer`` for ``params``, or None to pass.

    Stops at the first non-None result; if no plugin answers, the optimizer
    named by ``cfg.optimizer.name`` is built by the core. ``trainer`` is the
    Lightning Trainer (e.g. ``trainer.world_size`` for linear LR scaling).
    """


@hookspec
def configure_trainer(cfg, kwargs: dict):
    """Mutate ``kwargs``, the keyword arguments that will be given to ``pl.Trainer``.

    Start from ``cfg.trainer``; add a precision plugin, a strategy, callbacks
    (append to ``kwargs["callbacks"]``), a logger. Return value is ignored.
    """


# --------------------------------------------------------------------------------------
# loop: forwarded from Lightning by the bridge callback (trainer/bridge.py)
# --------------------------------------------------------------------------------------


@hookspec
def on_fit_start(cfg, trainer, module):
    """Lightning ``on_fit_start``: the model is on its device, training is about to begin."""


@hookspec
def on_run_accepted(cfg, trainer, module):
    """The run is accepted: every check passed, a resumed checkpoint's state is restored and
    training starts (``mode=validate|test|predict``: its evaluation starts). Once per run, on
    every process. From here the run owns its directory: a plugin that writes into it, or
    into a store of the run's (a logger's first record), starts here, not earlier, so that a
    command refused before this point leaves a resumed run's directory as it was."""


@hookspec
def transform_batch(cfg, batch):
    """Return a replacement for ``batch`` (after its device transfer), or None to keep it.

    A pipeline like ``configure_model``: each implementation receives the
    previous one's result. Called once per training and validation batch, so
    keep it cheap.
    """


@hookspec
def on_train_batch_start(cfg, trainer, module, batch, batch_idx):
    """Lightning ``on_train_batch_start``: a micro-batch is about to run forward."""


@hookspec
def on_before_backward(cfg, trainer, module, loss):
    """Lightning ``on_before_backward``: ``loss`` is about to be back-propagated."""


@hookspec
def on_after_backward(cfg, trainer, module):
    """Lightning ``on_after_backward``: gradients of this micro-batch are accumulated."""


@hookspec
def on_before_optimizer_step(cfg, trainer, module, optimizer):
    """Lightning ``on_before_optimizer_step``: once per optimizer step, before it.

    With a loss scaler (``precision=fp16``; ``amp`` where it picks float16) the gradients here
    are already unscaled, divided by the loss scale: their real values. They may hold inf or
    NaN: the hook fires also on the steps the scaler then skips (no ``optimizer.step()``;
    ``trainer.global_step`` advances all the same, and the summary counts them in
    ``precision.skipped_steps``), so check ``torch.isfinite`` before acting on them. To clip
    gradients, ``optimizer.clip_grad_norm=<norm>`` does it right after this hook, on the
    unscaled gradients, on any layout (trainer/clip.py). (tests/test_hook_facts.py measures all of this.)
    """


@hookspec
def on_train_batch_end(cfg, trainer, module, outputs, batch, batch_idx):
    """Lightning ``on_train_batch_end``; ``outputs["loss"]`` is the (unsynchronised) loss."""


@hookspec
def on_validation_start(cfg, trainer, module):
    """Lightning ``on_validation_start``: a validation (at an epoch end, or the final one) is
    about to run. With ``on_validation_end`` a plugin can swap weights in for validation and
    out after (e.g. an exponential moving average of the weights)."""


@hookspec
def on_validation_end(cfg, trainer, module):
    """Lightning ``on_validation_end``: validation metrics are in ``trainer.callback_metrics``."""


@hookspec
def on_save_checkpoint(cfg, trainer, module, checkpoint: dict):
    """A checkpoint dict is being written; add to it (plain containers and tensors only)."""


@hookspec
def on_load_checkpoint(cfg, trainer, module, checkpoint: dict):
    """A checkpoint dict was read on resume."""


@hookspec
def on_exception(cfg, trainer, module, exception):
    """Training raised ``exception``; release what the plugin holds. The run then fails."""


@hookspec
def on_fit_end(cfg, trainer, module):
    """Lightning ``on_fit_end``: training and validation have finished."""


# --------------------------------------------------------------------------------------
# report: after the fit, on the process that writes summary.json
# --------------------------------------------------------------------------------------


@hookspec
def report(cfg, summary: dict):
    """Add figures to ``summary`` (becomes ``summary.json``). Values must be JSON-serialisable.

    Called on global rank 0 only, after training, also when training failed
    (``summary["status"] == "failed"``), so report what was measured.
    """
