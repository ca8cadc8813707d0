"""Label smoothing, no weight decay on norms and biases, flip TTA: each does what it says.

Plain functions on small tensors; the run with all of them on is tests/test_target.py's.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from tuneup.plugins.kernels import Lamb
from tuneup.plugins.kernels.plugin import fused_cross_entropy
from tuneup.plugins.label_smoothing import smoothed_loss
from tuneup.plugins.tta import FlipHook, flip_average
from tuneup.plugins.weight_decay import param_groups
from tuneup.trainer.task import classification_loss, next_token_loss


def smoothed_ce(logits, target, amount):
    """The formula: cross-entropy against (1 - amount) x one-hot + amount / classes."""
    log_p = logits.log_softmax(-1)
    labels = F.one_hot(target, logits.shape[-1]).float() * (1 - amount) + amount / logits.shape[-1]
    return -(labels * log_p).sum(-1).mean()


@pytest.mark.parametrize("loss_fn", [classification_loss, next_token_loss,
                                     fused_cross_entropy({"ignore_index": -100})])  # fmt: skip
def test_label_smoothing_in_training_only(loss_fn):
    torch.manual_seed(0)
    logits, target = torch.randn(8, 5), torch.randint(0, 5, (8,))
    module = nn.Module()
    loss = smoothed_loss(loss_fn, 0.1, module)
    torch.testing.assert_close(loss(logits, target), smoothed_ce(logits, target, 0.1))
    module.eval()  # validation: the plain cross-entropy
    torch.testing.assert_close(loss(logits, target), F.cross_entropy(logits, target))


def test_norms_and_biases_get_no_weight_decay_with_any_optimizer():
    # LayerNorm over [C, H, W]: a 3-D weight, a norm by its module type, not its shape
    model = nn.Sequential(
        nn.Conv2d(3, 4, 3, bias=False),
        nn.BatchNorm2d(4),
        nn.LayerNorm([4, 6, 6]),
        nn.Flatten(),
        nn.Linear(4 * 6 * 6, 2),
    )
    groups = param_groups(model, list(model.parameters()))
    conv, linear = model[0], model[-1]
    decayed = {id(p) for p in (conv.weight, linear.weight)}
    assert [{id(p) for p in g["params"]} for g in groups] == [
        decayed,
        {id(p) for p in model.parameters()} - decayed,
    ]
    for make, wd in ((torch.optim.SGD, 5e-4), (torch.optim.AdamW, 0.05), (Lamb, 0.01)):
        optimizer = make(param_groups(model, list(model.parameters())), lr=0.1, weight_decay=wd)
        assert [g["weight_decay"] for g in optimizer.param_groups] == [wd, 0.0]
    # groups an earlier plugin made keep their options, split again
    regrouped = param_groups(model, [{"params": list(model.parameters()), "lr": 0.5}])
    assert [(g["lr"], g.get("weight_decay")) for g in regrouped] == [(0.5, None), (0.5, 0.0)]


def test_tta_logits_are_the_mean_of_the_flipped_pair():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 2, 3), nn.Flatten(), nn.Linear(2 * 6 * 6, 4))
    x = torch.randn(2, 3, 8, 8)
    expected = (model(x) + model(torch.flip(x, dims=[3]))) / 2
    torch.testing.assert_close(flip_average(model, x), expected)
    handle = model.register_forward_hook(FlipHook())
    torch.testing.assert_close(model(x), expected)  # what validation sees
    handle.remove()
    assert not torch.allclose(model(x), expected)
