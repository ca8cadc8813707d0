"""Whether a model can read its data's batches and the task can score its output.

Asked by :func:`tuneup.trainer.component_checks.component_problems` once model, data and
task are each sound; answered on the meta device (shapes only) from the run's
:class:`~tuneup.trainer.components.Plan`, the ``plan`` every function here takes (passed
in, not imported: components.py imports this module, through component_checks.py).
"""

from __future__ import annotations

import logging

import torch

from tuneup.trainer import task as tasks
from tuneup.trainer.batches import describe, pair
from tuneup.trainer.targets import arguments, chose_lightning

log = logging.getLogger(__name__)


def about_meta(exc: Exception) -> bool:
    """Whether an error is the meta device's limit (data-dependent code), not the model's."""
    return "meta" in str(exc).lower() or isinstance(exc, NotImplementedError)


def pairing_problems(plan) -> list[str]:
    """Whether the model can read the data's batches and the task can score its output (a zoo
    model's inputs against the zoo's data are checked before, in component_checks.py)."""
    cfg = plan.cfg
    if plan.user_model and plan._meta_model is None and not about_meta(plan.meta_error):
        args = ", ".join(f"{k}={v!r}" for k, v in arguments(cfg.model).items())
        return [
            f"model {plan.model_name} cannot be built with ({args}): "
            f"{type(plan.meta_error).__name__}: {plan.meta_error}"
        ]
    if chose_lightning(cfg.model) and not plan.lightning:
        return _not_lightning(plan)
    if plan.lightning:
        if cfg.get("task", "auto") != "auto":
            return [
                f"task={cfg.task} does not apply to model=lightning: the LightningModule "
                f"{plan.model_name} computes its own loss in training_step; remove task="
            ]
        return []
    both = f"model {plan.model_name} and data {plan.data_name}"
    if plan.task.model_loss and (found := _shifted_labels_problems(plan)):
        return found
    batch = plan.example_batch()
    if not plan.task.model_loss and not pair(batch):
        return [
            f"task={plan.task.name} needs (input, target) batches, but data "
            f"{plan.data_name} gives {describe(batch)}; use task=model_loss for a model "
            "that takes the whole batch and returns its loss"
        ]
    try:
        output = plan.output()
    except Exception as exc:
        if about_meta(exc):
            log.info("%s: not checked on the meta device (%s)", both, exc)
            return []
        return [
            f"{both} do not fit: the model fails on a batch of {describe(batch)}: "
            f"{type(exc).__name__}: {exc}"
        ]
    if output is None or plan.task.model_loss:
        return _loss_problems(plan, output)
    return _output_problems(plan, output, plan.sample[1] if plan.user_data else batch[1])


def _shifted_labels_problems(plan) -> list[str]:
    """A transformers causal LM under task=model_loss gets ``labels=y`` and shifts them by one
    itself: targets that are already the next tokens (tuneup's token data, or a user's whose
    ``y[:, :-1]`` is ``x[:, 1:]``) would teach it the token after next."""
    if plan._meta_model is None or not tasks.is_causal_lm(plan._meta_model):
        return []
    if plan.user_data:
        batch = plan.sample
        shifted = (
            pair(batch)
            and isinstance(batch[0], torch.Tensor)
            and batch[0].dim() == 2
            and batch[0].shape == batch[1].shape
            and not torch.equal(batch[0], batch[1])
            and torch.equal(batch[0][:, 1:], batch[1][:, :-1])
        )
    else:
        shifted = plan.data.inputs == "tokens"
    if not shifted:
        return []
    return [
        f"task=model_loss: model {plan.model_name} is a transformers causal LM, which "
        f"shifts its labels by one itself, but the targets of data {plan.data_name} are "
        "already the next tokens (y[t] = x[t+1]): it would learn the token after next. "
        "Use task=next_token (tuneup's loss on the model's .logits against y), or give "
        "batches of the input ids alone (labels = input_ids)"
    ]


def _not_lightning(plan) -> list[str]:
    """``model=lightning`` naming a plain ``nn.Module``: refused rather than trained the way
    ``model=custom`` trains it, so a user who picked the wrong group learns which is right."""
    import inspect

    target = plan.model_target
    if inspect.isclass(target):
        kind, verb = target, "is"
    elif plan._meta_model is not None:
        kind, verb = type(plan._meta_model), "returns"
    else:
        return []  # a function the meta device cannot call: what it returns is not known
    said = f"model=lightning needs a LightningModule, but {plan.model_name}"
    if not issubclass(kind, torch.nn.Module):
        return [f"{said} makes {kind.__name__} objects, not torch.nn.Modules"]
    return [
        f"{said} {verb} a torch.nn.Module: use model=custom model._target_={plan.model_name} "
        "(tuneup trains it with task=, optimizer= and scheduler=)"
    ]


def _loss_problems(plan, output) -> list[str]:
    if output is None:
        return []
    try:
        tasks.returned_loss(output)
    except TypeError as exc:
        return [f"model {plan.model_name}: {exc}"]
    return []


def _output_problems(plan, output, target) -> list[str]:
    """The output's shape against the targets' and the data's classes, per task."""
    both = f"model {plan.model_name} and data {plan.data_name}"
    if not isinstance(output, torch.Tensor):
        return [
            f"task={plan.task.name}: model {plan.model_name} returns "
            f"{type(output).__name__}, not a logits tensor; return the logits, or use "
            "task=model_loss and return the loss"
        ]
    out, want = tuple(output.shape), tuple(target.shape)
    if plan.task.name == "next_token":
        classes, expected = (out[-1] if out else None), out[:-1]
    else:
        classes, expected = (out[1] if len(out) > 1 else None), out[:1] + out[2:]
    if expected != want:
        hint = ""
        if plan.task.name == "classification" and out[:-1] == want:
            hint = "; for logits [B, T, V] per position use task=next_token"
        return [
            f"{both} do not fit: task={plan.task.name} needs targets of shape "
            f"{list(expected)} for the model's output {list(out)}, but the data's targets are "
            f"{list(want)}{hint}"
        ]
    declared = plan.num_classes
    if declared is not None and classes != declared:
        return [f"{both} do not fit: the model outputs {classes} classes, the data has {declared}"]
    if not target.is_floating_point() and target.device.type != "meta" and target.numel():
        top = int(target.max())
        if classes is not None and top >= classes:
            return [
                f"{both} do not fit: the data has label {top} but the model outputs only "
                f"{classes} classes (labels 0..{classes - 1})"
            ]
    return []
