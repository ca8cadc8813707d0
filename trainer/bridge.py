"""The one Lightning Callback that forwards loop events to the plugins' pluggy hooks.

Each Lightning callback method calls the hook of the same name with the run's
config; plugin state rides in the Lightning checkpoint under
``checkpoint["tuneup"][<plugin name>]``. The per-step hooks call their implementations
directly, in pluggy's order and with its error naming (pluggy itself where one is a wrapper):
a pluggy call costs ~5 us even with nothing to call, and a fast step (~3 ms) has five hooks
(bench/overhead.py). A per-step hook no plugin implements is not dispatched to the bridge
at all (:func:`skip_no_op_hooks`).
"""

from __future__ import annotations

import pytorch_lightning as pl

CHECKPOINT_KEY = "tuneup"


#: The hooks called on every micro-batch.
PER_STEP = (
    "on_train_batch_start",
    "on_before_backward",
    "on_after_backward",
    "on_before_optimizer_step",
    "on_train_batch_end",
)

#: The hooks Lightning calls on every micro-batch, on each callback and on the LightningModule.
LIGHTNING_PER_STEP = (*PER_STEP, "on_before_zero_grad")


def skip_no_op_hooks(obj, base: type, hooks=LIGHTNING_PER_STEP) -> None:
    """Set those of ``obj``'s per-step ``hooks`` that its class leaves as ``base``'s no-op to
    None on the instance: Lightning skips a hook that is not callable (its trainer/call.py),
    and otherwise calls each one on every micro-batch through a profiler scope, ~17 Python
    calls for a callback's and ~46 for a LightningModule's (two ``nn.Module.__setattr__`` of
    its ``_current_fx_name``) even when it does nothing (bench/overhead.py --calls)."""
    for name in hooks:
        if getattr(type(obj), name) is getattr(base, name):
            setattr(obj, name, None)


class Bridge(pl.Callback):
    def __init__(self, cfg, plugins) -> None:
        self.cfg = cfg
        self.plugins = plugins
        self.direct: dict[str, list] = {}  # per-step hook -> (function, argnames, plugin)

    def _call(self, name: str, trainer, module, **kwargs) -> None:
        self.plugins.call(name, cfg=self.cfg, trainer=trainer, module=module, **kwargs)

    def _step(self, name: str, trainer, module, **kwargs) -> None:
        impls = self.direct.get(name)
        if impls is None:
            return self._call(name, trainer, module, **kwargs)
        kwargs.update(cfg=self.cfg, trainer=trainer, module=module)
        for function, argnames, plugin in impls:
            try:
                function(*[kwargs[a] for a in argnames])
            except Exception as exc:
                raise self.plugins._error(plugin, name, exc) from exc

    def on_fit_start(self, trainer, pl_module):
        # The plugins are all registered by now: a per-step hook without implementations is
        # not dispatched to the bridge (a hook set to None on the instance) in this fit.
        self.direct = {}
        for hook in LIGHTNING_PER_STEP:
            self.__dict__.pop(hook, None)
        for hook in PER_STEP:
            impls = self.plugins.call_order(hook)
            if not impls:
                setattr(self, hook, None)
            elif not any(impl.hookwrapper or impl.wrapper for impl in impls):
                self.direct[hook] = [(i.function, i.argnames, i.plugin_name) for i in impls]
        skip_no_op_hooks(self, pl.Callback)
        self._call("on_fit_start", trainer, pl_module)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._step("on_train_batch_start", trainer, pl_module, batch=batch, batch_idx=batch_idx)

    def on_before_backward(self, trainer, pl_module, loss):
        self._step("on_before_backward", trainer, pl_module, loss=loss)

    def on_after_backward(self, trainer, pl_module):
        self._step("on_after_backward", trainer, pl_module)

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self._step("on_before_optimizer_step", trainer, pl_module, optimizer=optimizer)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self._step(
            "on_train_batch_end",
            trainer,
            pl_module,
            outputs=outputs,
            batch=batch,
            batch_idx=batch_idx,
        )

    def on_validation_start(self, trainer, pl_module):
        self._call("on_validation_start", trainer, pl_module)

    def on_validation_end(self, trainer, pl_module):
        self._call("on_validation_end", trainer, pl_module)

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        checkpoint[CHECKPOINT_KEY] = self.plugins.state_dicts()
        self._call("on_save_checkpoint", trainer, pl_module, checkpoint=checkpoint)

    def on_load_checkpoint(self, trainer, pl_module, checkpoint):
        self.plugins.load_state_dicts(checkpoint.get(CHECKPOINT_KEY, {}))
        self._call("on_load_checkpoint", trainer, pl_module, checkpoint=checkpoint)

    def on_exception(self, trainer, pl_module, exception):
        self._call("on_exception", trainer, pl_module, exception=exception)

    def on_fit_end(self, trainer, pl_module):
        self._call("on_fit_end", trainer, pl_module)
