"""How a model's output becomes the training loss and the validation metrics: ``task=...``.

=============  ==============================================  =========================
task           output and targets                              loss; metric
=============  ==============================================  =========================
classification logits ``[B, C, ...]``, labels ``[B, ...]``      cross-entropy over dim 1;
                                                               accuracy (argmax dim 1)
next_token     logits ``[B, T, V]``, targets ``[B, T]``          cross-entropy over the last
                                                               dim; token accuracy
model_loss     the model is called with the whole batch        what it returns: a loss
               (``model(x, y)``, or ``model(**batch)`` for a   tensor, ``out["loss"]`` or
               dict batch) and computes its own loss           ``out.loss``; no accuracy
auto           ``next_token`` on token data (``model=gpt``), else ``classification``
=============  ==============================================  =========================

A Hugging Face ``transformers.PreTrainedModel`` is called by its own convention: its input
by keyword (``model(input_ids=x)``, ``main_input_name``), and under ``model_loss``
``model(input_ids=x, labels=y)``, or ``labels=x`` for a batch of inputs alone (a causal
LM shifts its labels itself); the loss is the output's ``.loss``, the logits its ``.logits``
(a positional ``model(x, y)`` would put ``y`` in the model's cache argument).

Cross-entropy is computed in fp32 whatever the autocast type. For 2-D logits the two
cross-entropy tasks are the same computation, so the built-in image models train exactly
the same under either.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch.nn import functional as F

CHOICES = ("auto", "classification", "next_token", "model_loss")


def classification_loss(
    logits: torch.Tensor, target: torch.Tensor, label_smoothing: float = 0.0
) -> torch.Tensor:
    """Cross-entropy with the classes on dim 1 (``[B, C]``, or ``[B, C, H, W]`` per pixel).
    ``target``: class indices, or float probabilities shaped as ``logits`` (soft labels, e.g.
    from mixup or cutmix: plugins/augment.py)."""
    if target.is_floating_point():
        return F.cross_entropy(logits.float(), target.float(), label_smoothing=label_smoothing)
    if logits.dim() == 2:  # the same kernel as next_token's: bitwise the loss it always was
        return next_token_loss(logits, target, label_smoothing)
    return F.cross_entropy(logits.float(), target, label_smoothing=label_smoothing)


def next_token_loss(
    logits: torch.Tensor, target: torch.Tensor, label_smoothing: float = 0.0
) -> torch.Tensor:
    """Cross-entropy with the classes on the last dim (``[B, T, V]`` with ``[B, T]``);
    ``label_smoothing``: torch's (plugins/label_smoothing.py sets it for training)."""
    return F.cross_entropy(
        logits.flatten(0, -2).float(), target.flatten(), label_smoothing=label_smoothing
    )


@dataclass(frozen=True)
class Task:
    name: str
    loss_fn: Callable | None  # (output, target) -> loss; None: the model returns its loss
    class_dim: int  # where the classes are in the output, for accuracy

    @property
    def model_loss(self) -> bool:
        return self.loss_fn is None

    @property
    def metrics(self) -> tuple[str, ...]:
        """What each validation logs under this task (trainer/module.py): a target's choices."""
        return ("val/loss",) if self.model_loss else ("val/loss", "val/acc")

    def accuracy(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if target.is_floating_point():  # soft labels: their most probable class
            target = target.argmax(self.class_dim)
        return (logits.argmax(self.class_dim) == target).float().mean()


TASKS = {
    "classification": Task("classification", classification_loss, 1),
    "next_token": Task("next_token", next_token_loss, -1),
    "model_loss": Task("model_loss", None, -1),
}


def resolve(name: str, inputs: str | None) -> Task:
    """The task ``name`` means; ``auto`` by the data's kind (``inputs``: images, tokens, None)."""
    if name == "auto":
        name = "next_token" if inputs == "tokens" else "classification"
    return TASKS[name]


def is_transformers(model) -> bool:
    """Whether ``model`` is a Hugging Face ``transformers.PreTrainedModel``. transformers is
    not imported for this: a model of its classes means its ``modeling_utils`` already is
    (``transformers.PreTrainedModel`` would import it, a second of CPU, in every run: Lightning
    imports ``transformers`` itself, whose attributes load lazily)."""
    modeling = sys.modules.get("transformers.modeling_utils")
    return modeling is not None and isinstance(model, modeling.PreTrainedModel)


def is_causal_lm(model) -> bool:
    """Whether ``model`` is (or derives from) one of transformers' causal LM classes: those
    shift their ``labels`` by one themselves (``labels=input_ids``)."""
    if not is_transformers(model):
        return False
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    names = set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())
    return any(cls.__name__ in names for cls in type(model).__mro__)


def forward(model, x):
    """``model``'s output for the input ``x``: ``model(x)``; a transformers model gets it by
    keyword (``input_ids=x``, or whatever its ``main_input_name`` is)."""
    if is_transformers(model):
        return model(**{model.main_input_name: x})
    return model(x)


def logits_of(output):
    """The logits in a model's output: the tensor itself, or a transformers output's
    ``.logits`` (``out["logits"]``); anything else as it is, for the checks to name."""
    if isinstance(output, torch.Tensor):
        return output
    found = output.get("logits") if isinstance(output, Mapping) else getattr(output, "logits", None)
    return found if isinstance(found, torch.Tensor) else output


def call_model(model, batch):
    """``model`` called with a whole batch (task=model_loss): ``model(**batch)`` for a dict,
    ``model(*batch)`` for a tuple or list, else ``model(batch)``; a transformers model with
    :func:`labelled` keywords."""
    if isinstance(batch, Mapping):
        return model(**batch)
    if is_transformers(model):
        return model(**labelled(model, batch))
    if isinstance(batch, (tuple, list)):
        return model(*batch)
    return model(batch)


def labelled(model, batch) -> dict:
    """A batch as a transformers model's keywords: ``(x, y)`` -> ``input_ids=x, labels=y``;
    ``x`` alone (a tensor or a 1-tuple) -> ``input_ids=x, labels=x``, the convention of its
    causal LMs, which shift the labels themselves."""
    items = list(batch) if isinstance(batch, (tuple, list)) else [batch]
    if len(items) not in (1, 2):
        raise TypeError(
            f"task=model_loss: a transformers model takes (inputs, labels), inputs alone, or a "
            f"dict of its keywords; the batch has {len(items)} parts"
        )
    x, y = items if len(items) == 2 else items * 2
    return {model.main_input_name: x, "labels": y}


def returned_loss(output) -> torch.Tensor:
    """The loss in what a model returned: the tensor itself, ``output["loss"]`` or ``output.loss``."""
    if isinstance(output, torch.Tensor):
        loss = output
    elif isinstance(output, Mapping) and "loss" in output:
        loss = output["loss"]
    else:
        loss = getattr(output, "loss", None)
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise TypeError(
            "task=model_loss: the model must return its loss (a scalar tensor, a dict with "
            f"'loss', or an object with .loss), but returned {type(output).__name__}"
        )
    return loss.reshape(())
