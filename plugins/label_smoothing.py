"""Label smoothing, chosen by ``label_smoothing=on`` (``label_smoothing.amount``, default 0.1).

The training loss is cross-entropy against ``(1 - amount) x one-hot + amount / classes``
(Szegedy et al. 2016): the model is not pushed to infinite logits on the training labels,
which is why MLPerf's ResNet-50 (0.1), FFCV (0.1) and airbench (0.2) use it. It is torch's own
``F.cross_entropy(label_smoothing=...)`` in the task's loss (trainer/task.py), or the fused
cross-entropy kernels' own smoothing under ``kernels=[cross_entropy|linear_cross_entropy]``:
the plugin hands the amount to whichever loss the run has, as its ``label_smoothing``
keyword. Soft labels (mixup, cutmix) are smoothed as well, as torch does.

Training only: the validation loss stays the plain cross-entropy, so ``val/loss`` (and a
target on it, plugins/target/) means the same with and without smoothing.
"""

from __future__ import annotations

from functools import partial

from tuneup import hookimpl
from tuneup.trainer.validation import Number, problems

RULES = {"label_smoothing.amount": Number(ge=0, lt=1)}


def smoothed_loss(loss_fn, amount: float, module):
    """``loss_fn`` (``(output, target, label_smoothing=...)``) with ``amount`` of smoothing
    while ``module`` trains, none while it is evaluated."""
    smoothed, plain = partial(loss_fn, label_smoothing=amount), loss_fn

    def loss(output, target):
        return (smoothed if module.training else plain)(output, target)

    return loss


def problems_with(cfg, plan) -> list[str]:
    found = problems(cfg, RULES)
    chosen = f"label_smoothing.amount={cfg.label_smoothing.get('amount')}"
    if plan is not None and plan.lightning:
        found.append(
            f"label_smoothing=on cannot apply to model=lightning: the LightningModule "
            f"{plan.model_name} computes its own loss; use its own label smoothing "
            "(F.cross_entropy(label_smoothing=...)), or remove label_smoothing=on"
        )
    elif plan is not None and plan.sound and plan.task.model_loss:
        found.append(
            "label_smoothing=on smooths the cross-entropy of the task, but with "
            "task=model_loss the model computes its own loss; remove label_smoothing=on"
        )
    for op, settings in ((cfg.get("kernels") or {}).get("ops") or {}).items():
        if (settings or {}).get("label_smoothing"):
            found.append(
                f"kernels.ops.{op}.label_smoothing={settings.label_smoothing} and "
                f"{chosen} both smooth the labels; set it in one place "
                f"(kernels.ops.{op}.label_smoothing=0.0)"
            )
    return found


class Plugin:
    def __init__(self, cfg) -> None:
        self.amount = cfg.label_smoothing.get("amount", 0.1)

    @hookimpl
    def check(self, cfg, plan):
        return problems_with(cfg, plan)

    @hookimpl(trylast=True)  # after a kernels plugin swapped its fused loss in
    def on_fit_start(self, module):
        if getattr(module, "loss_fn", None) is not None:  # tuneup's TrainingModule
            module.loss_fn = smoothed_loss(module.loss_fn, self.amount, module)

    def describe(self):
        return {"amount": self.amount, "applies_to": "training loss (validation: plain)"}
