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
                                            (:class:`~tuneup.trainer.datamodule.UserData`)
==========================================  =============================================

A :class:`Plan` holds what is known before anything real is built: the names, the data
module (built once, reused for training), the model built on the *meta* device (shapes
only: no memory, no compute) and a sample batch. The run's checks use it, so a model that
cannot read the data is an error naming both before a process is spawned, and plugins ask
it whether they apply (``check(cfg, env, plan)``).
"""

from __future__ import annotations

import importlib
import inspect
import logging
from functools import cached_property

import torch
from torch import nn

from tuneup import TuneupError
from tuneup.trainer import task as tasks
from tuneup.trainer.datamodule import DataModule, UserData

log = logging.getLogger(__name__)

TARGET = "_target_"
#: Keys of ``data`` that are tuneup's own, not arguments of a data target.
DATA_KEYS = ("batch_size",)


def is_user(node) -> bool:
    """Whether a ``model`` or ``data`` node names the user's own code (``_target_``), or is
    meant to and does not yet (``model=custom`` without ``model._target_``: ``???``)."""
    from omegaconf import OmegaConf

    return node is not None and (TARGET in node or OmegaConf.is_missing(node, TARGET))


#: What to say when ``model=custom|lightning`` or ``data=custom`` comes without ``_target_``.
MISSING_TARGET = {
    "model": "model._target_ is not set: your own model needs the dotted path of its class "
    "(or of a function returning it), e.g. model._target_=my_project.nets.Net",
    "data": "data._target_ is not set: your own data needs the dotted path of its "
    "LightningDataModule (or of a function returning Datasets), e.g. "
    "data._target_=my_project.data.MyData",
}


def target_path(node, group: str) -> str:
    """The ``_target_`` of the user's ``model`` or ``data`` node; TuneupError when not given."""
    from omegaconf import OmegaConf

    if OmegaConf.is_missing(node, TARGET):
        raise TuneupError(MISSING_TARGET[group])
    return str(node[TARGET])


def arguments(node, drop=()) -> dict:
    """The keys beside ``_target_`` of ``node``, as plain Python values."""
    from omegaconf import OmegaConf

    values = OmegaConf.to_container(node, resolve=True)
    return {k: v for k, v in values.items() if k != TARGET and k not in drop}


def locate(path: str, key: str):
    """The object at dotted ``path`` (a class or function); TuneupError saying why not.

    The longest importable module prefix is imported and the rest looked up as attributes,
    so a typo names the module and what it has, and an error raised while importing the
    user's module is shown as that error.
    """
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        module_name = ".".join(parts[:i])
        try:
            obj = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and (module_name + ".").startswith(exc.name + "."):
                continue  # this prefix is not a module: look the rest up as attributes
            raise _cannot_import(key, path, exc) from exc
        except Exception as exc:  # the user's module raised while being imported
            raise _cannot_import(key, path, exc) from exc
        for depth, attr in enumerate(parts[i:], start=i):
            if not hasattr(obj, attr):
                owner = ".".join(parts[:depth])
                names = sorted(n for n in dir(obj) if not n.startswith("_"))[:12]
                raise TuneupError(
                    f"{key}={path!r}: {owner} has no attribute {attr!r} "
                    f"(it has: {', '.join(names) or 'nothing public'})"
                )
            obj = getattr(obj, attr)
        return obj
    raise TuneupError(
        f"{key}={path!r}: no module {parts[0]!r} can be imported; give the dotted path of a "
        "class or function importable from the current directory or an installed package"
    )


def _cannot_import(key: str, path: str, exc: Exception) -> TuneupError:
    return TuneupError(f"{key}={path!r} cannot be imported: {type(exc).__name__}: {exc}")


def accepts(target, name: str) -> bool:
    """Whether calling ``target`` takes a keyword argument ``name``."""
    try:
        parameters = inspect.signature(target).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == name or p.kind is p.VAR_KEYWORD for p in parameters)


def to_meta(batch):
    """``batch`` with every tensor replaced by an empty one of its shape on the meta device."""
    if isinstance(batch, torch.Tensor):
        return torch.empty_like(batch, device="meta")
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_meta(item) for item in batch)
    if isinstance(batch, dict):
        return {key: to_meta(value) for key, value in batch.items()}
    return batch


def first_tensor(batch) -> torch.Tensor | None:
    if isinstance(batch, torch.Tensor):
        return batch
    items = batch.values() if isinstance(batch, dict) else batch
    if isinstance(items, (list, tuple, type({}.values()))):
        for item in items:
            if (found := first_tensor(item)) is not None:
                return found
    return None


def input_kind(x: torch.Tensor | None) -> str | None:
    """What a batch's input is: token ids ``[B, T]``, images ``[B, C, H, W]``, or unknown."""
    if x is None:
        return None
    if x.dim() == 2 and not x.is_floating_point():
        return "tokens"
    return "images" if x.dim() == 4 and x.is_floating_point() else None


def about_meta(exc: Exception) -> bool:
    """Whether an error is the meta device's limit (data-dependent code), not the model's."""
    return "meta" in str(exc).lower() or isinstance(exc, NotImplementedError)


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
            raise TuneupError(f"data._target_={self.data_name} could not be made: "
                              f"{type(cause).__name__}: {cause}") from exc  # fmt: skip
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
            raise TuneupError(f"data._target_={self.data_name}: its training samples could not "
                              f"be read: {type(exc).__name__}: {exc}") from exc  # fmt: skip

    @property
    def inputs(self) -> str | None:
        """What the model reads: "images", "tokens", or None (unknown)."""
        if not self.user_data:
            return self.data.inputs
        return input_kind(first_tensor(self.sample[0] if _pair(self.sample) else self.sample))

    @property
    def input_shape(self) -> tuple[int, ...] | None:
        if not self.user_data:
            return tuple(self.data.input_shape)
        x = first_tensor(self.sample[0] if _pair(self.sample) else self.sample)
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
        from tuneup.zoo.models import build_model

        if self.input_shape is None or self.num_classes is None:
            raise TuneupError(self._zoo_needs())
        return build_model(self.cfg, self.input_shape, self.num_classes)

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


def _pair(batch) -> bool:
    return isinstance(batch, (tuple, list)) and len(batch) == 2


def component_problems(plan: Plan) -> list[str]:
    """Problems with ``model``, ``data`` and ``task``, then whether the model can read the data.

    Each side is checked on its own first (the zoo's rules, or whether the user's target
    imports and its data can be read); only when both are sound is the pairing checked.
    """
    from tuneup.trainer.validation import Integer, OneOf, problems
    from tuneup.zoo.data import check_data
    from tuneup.zoo.models import check_model

    cfg = plan.cfg
    found = problems(cfg, {"task": OneOf(tasks.CHOICES)})
    model_side = _user_problems(lambda: plan.model_target) if plan.user_model else check_model(cfg)
    data_side = _user_problems(lambda: plan.sample) if plan.user_data else check_data(cfg)
    found += model_side + data_side
    if plan.user_data and not data_side:
        found += problems(cfg, {"data.batch_size": Integer(low=1, also=(None,),
                                                           note="null: the data module's own")})  # fmt: skip
        if plan.data.source is None and plan.data.batch_size is None:
            found.append(f"data.batch_size is not set: data._target_={plan.data_name} returns "
                         "Datasets, so tuneup makes the DataLoaders; give the batch size per "
                         "process, e.g. data.batch_size=64")  # fmt: skip
    if not found:
        found += pairing_problems(plan)
    return found


def _user_problems(touch) -> list[str]:
    """The error of reaching a user's target (importing it, reading its data), as a problem."""
    try:
        touch()
    except TuneupError as exc:
        return [str(exc)]
    return []


def pairing_problems(plan: Plan) -> list[str]:
    """Whether the model can read the data's batches and the task can score its output."""
    cfg = plan.cfg
    if plan.user_model and plan._meta_model is None and not about_meta(plan.meta_error):
        args = ", ".join(f"{k}={v!r}" for k, v in arguments(cfg.model).items())
        return [f"model {plan.model_name} cannot be built with ({args}): "
                f"{type(plan.meta_error).__name__}: {plan.meta_error}"]  # fmt: skip
    if plan.lightning:
        if cfg.get("task", "auto") != "auto":
            return [f"task={cfg.task} does not apply to model=lightning: the LightningModule "
                    f"{plan.model_name} computes its own loss in training_step; remove task="]  # fmt: skip
        return []
    if not plan.user_model:
        found = _zoo_input_problems(plan)
        if found or not plan.user_data:
            return found

    both = f"model {plan.model_name} and data {plan.data_name}"
    if plan.task.model_loss and (found := _shifted_labels_problems(plan)):
        return found
    batch = plan.example_batch()
    if not plan.task.model_loss and not _pair(batch):
        return [f"task={plan.task.name} needs (input, target) batches, but data "
                f"{plan.data_name} gives {_describe(batch)}; use task=model_loss for a model "
                "that takes the whole batch and returns its loss"]  # fmt: skip
    try:
        output = plan.output()
    except Exception as exc:
        if about_meta(exc):
            log.info("%s: not checked on the meta device (%s)", both, exc)
            return []
        return [f"{both} do not fit: the model fails on a batch of {_describe(batch)}: "
                f"{type(exc).__name__}: {exc}"]  # fmt: skip
    if output is None or plan.task.model_loss:
        return _loss_problems(plan, output)
    return _output_problems(plan, output, plan.sample[1] if plan.user_data else batch[1])


def _shifted_labels_problems(plan: Plan) -> list[str]:
    """A transformers causal LM under task=model_loss gets ``labels=y`` and shifts them by one
    itself: targets that are already the next tokens (tuneup's token data, or a user's whose
    ``y[:, :-1]`` is ``x[:, 1:]``) would teach it the token after next."""
    if plan._meta_model is None or not tasks.is_causal_lm(plan._meta_model):
        return []
    if plan.user_data:
        batch = plan.sample
        shifted = (_pair(batch) and isinstance(batch[0], torch.Tensor) and batch[0].dim() == 2
                   and batch[0].shape == batch[1].shape and not torch.equal(batch[0], batch[1])
                   and torch.equal(batch[0][:, 1:], batch[1][:, :-1]))  # fmt: skip
    else:
        shifted = plan.data.inputs == "tokens"
    if not shifted:
        return []
    return [f"task=model_loss: model {plan.model_name} is a transformers causal LM, which "
            f"shifts its labels by one itself, but the targets of data {plan.data_name} are "
            "already the next tokens (y[t] = x[t+1]): it would learn the token after next. "
            "Use task=next_token (tuneup's loss on the model's .logits against y), or give "
            "batches of the input ids alone (labels = input_ids)"]  # fmt: skip


def _loss_problems(plan: Plan, output) -> list[str]:
    if output is None:
        return []
    try:
        tasks.returned_loss(output)
    except TypeError as exc:
        return [f"model {plan.model_name}: {exc}"]
    return []


def _output_problems(plan: Plan, output, target) -> list[str]:
    """The output's shape against the targets' and the data's classes, per task."""
    both = f"model {plan.model_name} and data {plan.data_name}"
    if not isinstance(output, torch.Tensor):
        return [f"task={plan.task.name}: model {plan.model_name} returns "
                f"{type(output).__name__}, not a logits tensor; return the logits, or use "
                "task=model_loss and return the loss"]  # fmt: skip
    out, want = tuple(output.shape), tuple(target.shape)
    if plan.task.name == "next_token":
        classes, expected = (out[-1] if out else None), out[:-1]
    else:
        classes, expected = (out[1] if len(out) > 1 else None), out[:1] + out[2:]
    if expected != want:
        hint = ""
        if plan.task.name == "classification" and out[:-1] == want:
            hint = "; for logits [B, T, V] per position use task=next_token"
        return [f"{both} do not fit: task={plan.task.name} needs targets of shape "
                f"{list(expected)} for the model's output {list(out)}, but the data's targets are "
                f"{list(want)}{hint}"]  # fmt: skip
    declared = plan.num_classes
    if declared is not None and classes != declared:
        return [f"{both} do not fit: the model outputs {classes} classes, the data has "
                f"{declared}"]  # fmt: skip
    if not target.is_floating_point() and target.device.type != "meta" and target.numel():
        top = int(target.max())
        if classes is not None and top >= classes:
            return [f"{both} do not fit: the data has label {top} but the model outputs only "
                    f"{classes} classes (labels 0..{classes - 1})"]  # fmt: skip
    return []


def _zoo_input_problems(plan: Plan) -> list[str]:
    """A zoo model that cannot read the data: GPT on images, a ResNet on tokens, no classes."""
    from tuneup.zoo.data import DATA
    from tuneup.zoo.models import MODELS

    wanted, given = MODELS[plan.cfg.model.name].inputs, plan.inputs
    if plan.user_data and (plan.num_classes is None or plan.input_shape is None):
        return [plan._zoo_needs()]
    if given is None or given == wanted:
        return []
    fitting = sorted(n for n, d in DATA.items() if d.inputs == wanted)
    return [
        f"model={plan.model_name} reads {wanted} but data={plan.data_name} gives {given}; "
        f"use data={' or data='.join(fitting)}, or a model for {given}"
    ]


def _describe(batch) -> str:
    if isinstance(batch, torch.Tensor):
        return f"a tensor {list(batch.shape)}"
    if isinstance(batch, dict):
        return "a dict of " + ", ".join(f"{k} {_describe(v)}" for k, v in batch.items())
    if isinstance(batch, (list, tuple)):
        return f"a {type(batch).__name__} of " + ", ".join(_describe(b) for b in batch)
    return type(batch).__name__
