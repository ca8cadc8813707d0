"""What a run trains: the zoo's model and data by name, or the user's own by ``_target_``.

==========================================  =============================================
config                                      what is built
==========================================  =============================================
``model=<name>`` (``model.name``)           a zoo model, :mod:`tuneup.zoo.models`
``model=custom model._target_=pkg.Net``     the user's ``nn.Module``: Hydra's
                                            ``instantiate``, every other key under
                                            ``model.`` is an argument (``model.width=256``)
``model=lightning model._target_=pkg.Lit``  the user's ``LightningModule``, trained with its
                                            own ``training_step``/``configure_optimizers``
``data=<name>`` (``data.name``)             a zoo data set, :mod:`tuneup.zoo.data`
``data=custom data._target_=pkg.DM``        the user's ``LightningDataModule``, or a
                                            callable returning train/val ``Dataset``\\ s
                                            (:class:`~tuneup.trainer.user_data.UserData`)
==========================================  =============================================

A :class:`Plan` holds what is known before anything real is built: the names, the data
module (built once, reused for training), the model built on the *meta* device (shapes
only: no memory, no compute) and a sample batch. The run's checks use it, so a model that
cannot read the data is an error naming both before a process is spawned (its checks:
component_checks.py), and plugins ask it whether they apply (``check(cfg, env, plan)``).
"""

from __future__ import annotations

import inspect
import logging
from functools import cached_property

import torch
from torch import nn

from tuneup.errors import TuneupError
from tuneup.trainer import task as tasks
from tuneup.trainer.batches import first_tensor, input_kind, pair, to_meta
from tuneup.trainer.component_checks import component_problems
from tuneup.trainer.datamodule import DataModule
from tuneup.trainer.targets import (
    DATA_KEYS,
    TARGET,
    accepts,
    arguments,
    is_user,
    locate,
    target_path,
)
from tuneup.trainer.user_data import UserData

log = logging.getLogger(__name__)


class Plan:
    """What a run will train, known before anything real is built (see the module docstring).

    ``plugins`` (the run's plugin manager) gives the data module's DataLoaders the
    ``configure_dataloader`` hook; without it they get torch's defaults.
    """

    def __init__(self, cfg, plugins=None) -> None:
        self.cfg = cfg
        self.plugins = plugins

    # -- names ----------------------------------------------------------------------------

    @property
    def user_model(self) -> bool:
        return is_user(self.cfg.model)

    @property
    def user_data(self) -> bool:
        return is_user(self.cfg.data)

    @property
    def config_made(self) -> bool:
        """Whether the model is wholly given by its config: the zoo's, with no weights read
        from disk (not the user's code, not ``model=huggingface``)."""
        if self.user_model:
            return False
        from tuneup.zoo.models import MODELS

        return MODELS[self.cfg.model.name].loader is None

    @property
    def model_name(self) -> str:
        return self._name(self.cfg.model, self.user_model)

    @property
    def data_name(self) -> str:
        return self._name(self.cfg.data, self.user_data)

    @staticmethod
    def _name(node, user: bool) -> str:
        from omegaconf import OmegaConf

        if not user:
            return str(node.get("name"))
        return "???" if OmegaConf.is_missing(node, TARGET) else str(node[TARGET])

    # -- the pieces -------------------------------------------------------------------------

    @cached_property
    def model_target(self):
        return locate(target_path(self.cfg.model, "model"), "model._target_")

    @cached_property
    def lightning(self) -> bool:
        """Whether the model is the user's own LightningModule, trained as it is (False when
        its target cannot be imported: the core reports that)."""
        if not self.user_model:
            return False
        import pytorch_lightning as pl

        try:
            target = self.model_target
        except TuneupError:
            return False
        if inspect.isclass(target):
            return issubclass(target, pl.LightningModule)
        return isinstance(self._meta_model, pl.LightningModule)

    @cached_property
    def data(self) -> DataModule:
        """The data module, built once (check and training use the same one)."""
        configure = None
        if self.plugins is not None:
            plugins, cfg = self.plugins, self.cfg

            def configure(kwargs: dict) -> None:
                plugins.call("configure_dataloader", cfg=cfg, kwargs=kwargs)

        if self.user_data:
            data = self._user_data(configure)
        else:
            from tuneup.zoo.data import DATA

            data = DATA[self.cfg.data.name](self.cfg.data, configure)
        data.order_seed = self.cfg.seed
        return data

    def _user_data(self, configure) -> UserData:
        import pytorch_lightning as pl
        from hydra.utils import instantiate

        node = self.cfg.data
        target = locate(target_path(node, "data"), "data._target_")
        if isinstance(self.cfg.get("seed"), int) and self.cfg.seed >= 0:
            pl.seed_everything(self.cfg.seed, workers=True, verbose=False)  # it may draw
        drop = [k for k in DATA_KEYS if node.get(k) is None or not accepts(target, k)]
        try:
            source = instantiate({TARGET: node[TARGET], **arguments(node, drop)})
        except Exception as exc:
            cause = exc.__cause__ or exc
            raise TuneupError(
                f"data._target_={self.data_name} could not be made: {type(cause).__name__}: {cause}"
            ) from exc
        return UserData(source, node, configure, self.data_name)

    @cached_property
    def sample(self):
        """A real batch of two training samples (the user's data), or None (the zoo's)."""
        if not self.user_data:
            return None
        try:
            return self.data.sample(2)
        except TuneupError:
            raise
        except Exception as exc:
            raise TuneupError(
                f"data._target_={self.data_name}: its training samples could not "
                f"be read: {type(exc).__name__}: {exc}"
            ) from exc

    @property
    def inputs(self) -> str | None:
        """What the model reads: "images", "tokens", or None (unknown)."""
        if not self.user_data:
            return self.data.inputs
        return input_kind(first_tensor(self.sample[0] if pair(self.sample) else self.sample))

    @property
    def input_shape(self) -> tuple[int, ...] | None:
        if not self.user_data:
            return tuple(self.data.input_shape)
        x = first_tensor(self.sample[0] if pair(self.sample) else self.sample)
        return None if x is None else tuple(x.shape[1:])

    @property
    def num_classes(self) -> int | None:
        return self.data.num_classes

    @cached_property
    def task(self) -> tasks.Task:
        return tasks.resolve(str(self.cfg.get("task", "auto")), self.inputs)

    def example_batch(self, device="meta"):
        """A batch shaped like the data's: the sampled one for the user's data, else zeros."""
        if self.user_data:
            return to_meta(self.sample) if device == "meta" else self.sample
        from tuneup.trainer.flops import example_batch

        return example_batch(self.data, device=device)

    def build_model(self) -> nn.Module:
        """The model (CPU, initialised): the zoo's by name, or the user's target."""
        if self.user_model:
            from hydra.utils import instantiate

            node = self.cfg.model
            options = {} if "_convert_" in node else {"_convert_": "all"}
            return instantiate(node, **options)
        from tuneup.zoo.models import MODELS, build_model

        shaped = MODELS[self.cfg.model.name].own_config  # its shapes come from its own config
        if not shaped and (self.input_shape is None or self.num_classes is None):
            raise TuneupError(self._zoo_needs())
        return build_model(self.cfg, self.input_shape, self.num_classes)

    @property
    def weights(self):
        """What fills the model's parameters once materialised empty and sharded
        (``strategy=fsdp``): ``model=huggingface``'s pretrained weights, each process reading its
        shards' slices; None: the strategy initialises them."""
        if self.user_model:
            return None
        from tuneup.zoo.models import MODELS

        loader = MODELS[self.cfg.model.name].loader
        return loader(self.cfg.model) if loader is not None else None

    def _zoo_needs(self) -> str:
        return (
            f"model={self.model_name} needs the data's input shape and number of classes, but "
            f"data {self.data_name} does not say its classes (give the data module or the "
            "data set a num_classes attribute), or use your own model: model=custom"
        )

    @cached_property
    def problems(self) -> list[str]:
        """What is wrong with the model, the data and the task, or how they pair (cached)."""
        return component_problems(self)

    @property
    def sound(self) -> bool:
        """Whether model, data and task are fine together: only then may plugins ask about them."""
        return not self.problems

    def meta_model(self) -> nn.Module | None:
        """The model built on the meta device (shapes only), or None when it cannot be: a
        builder that needs real tensors, or a config the checks refuse. Built once."""
        return self._meta_model if self.sound else None

    meta_error: Exception | None = None  # why the model could not be built on the meta device

    @cached_property
    def _meta_model(self) -> nn.Module | None:
        try:
            with torch.device("meta"):
                return self.build_model()
        except Exception as exc:
            self.meta_error = exc.__cause__ or exc  # Hydra wraps the target's own error
            log.debug("the model cannot be built on the meta device: %s", exc)
            return None

    def output(self):
        """The meta model's output on an example batch (None if it cannot be computed)."""
        model = self._meta_model
        if model is None or self.lightning:
            return None
        batch = self.example_batch()
        if self.task.model_loss:
            return tasks.call_model(model, batch)
        return tasks.logits_of(tasks.forward(model, batch[0]))
