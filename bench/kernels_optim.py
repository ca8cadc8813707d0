"""The optim section of bench/kernels.py: one LAMB / LARS step, and its torch._foreach baseline.

``OptimCases.bench_optimizer`` is a method of bench/kernels.py's ``Bench`` (which holds the sizes,
timing and checks); ``bert_shapes`` is the parameter set it steps over and ``foreach_version`` the
torch._foreach version of each step it compares against. Imported by bench/kernels.py, not run on
its own.
"""

from __future__ import annotations

import math


class OptimCases:
    """The optim section's case (see bench/kernels.py's docstring for what it measures)."""

    # -- optimizers ----------------------------------------------------------------------------

    def bench_optimizer(self, name: str) -> list[str]:
        torch = self.torch
        fused_class = getattr(self.kernels, name)
        foreach_class = foreach_version(fused_class)
        shapes = bert_shapes(
            self.sizes["opt_width"], self.sizes["opt_layers"], self.sizes["opt_vocab"]
        )
        numel = sum(math.prod(s) for s in shapes)
        op = f"{name} step, {len(shapes)} tensors, {numel / 1e6:.0f}M fp32"
        moved = (7 if name == "Lamb" else 5) * 4 * numel  # param, grad, state: reads + writes

        def optimizer(make):
            params = [torch.randn(s, device=self.device).requires_grad_() for s in shapes]
            for param in params:
                param.grad = torch.randn_like(param)
            return make(params)

        steps = {
            "tuneup fused (Triton)": optimizer(lambda p: fused_class(p, fused=True)).step,
            "eager per-parameter": optimizer(lambda p: fused_class(p)).step,
            "torch._foreach": optimizer(foreach_class).step,
            "torch.compile of the eager loop": self.compiled(
                optimizer(lambda p: fused_class(p)).step
            ),
        }
        times = {variant: self.time_ms(step) for variant, step in steps.items()}
        rows = [self.row(op, variant, "step", ms, moved) for variant, ms in times.items()]
        fused = times["tuneup fused (Triton)"]
        speedup = times["eager per-parameter"] / fused
        self.check(f"{op}: fused speed-up over eager (>= 3)", speedup, speedup >= 3)
        compiled = times["torch.compile of the eager loop"] / fused
        self.check(f"{op}: compiled time / fused (>= 1)", compiled, compiled >= 1)
        return rows


def bert_shapes(width: int, layers: int, vocab: int) -> list[tuple[int, ...]]:
    """Parameter shapes of BERT-large (width 1024, 24 layers): embeddings, then per layer the
    attention and MLP matrices with their biases and two LayerNorms."""
    embeddings = [(vocab, width), (512, width), (2, width), (width,), (width,)]
    per_layer = [(width, width), (width,)] * 4  # query, key, value, output
    per_layer += [(4 * width, width), (4 * width,), (width, 4 * width), (width,)]
    per_layer += [(width,)] * 4  # two LayerNorms
    return embeddings + [shape for _ in range(layers) for shape in per_layer]


# -- torch._foreach versions of the steps: the baseline between the eager loop and fusion -------


def foreach_version(optimizer_class):
    """``optimizer_class`` (Lamb or Lars) whose unfused step runs the torch._foreach version."""
    step = lamb_foreach if optimizer_class.OP_NAME == "lamb" else lars_foreach
    return type(
        f"Foreach{optimizer_class.__name__}",
        (optimizer_class,),
        {"step_reference": staticmethod(step)},
    )


def _unscaled(params, grad_scale):
    import torch

    grads = [p.grad for p in params]
    return grads if grad_scale is None else torch._foreach_div(grads, grad_scale)


def lamb_foreach(group, params, states, grad_scale, found_inf):
    """LAMB's update (plugins/kernels/lamb.py) with torch._foreach ops over all tensors."""
    import torch

    from tuneup.plugins.kernels.lamb import trust_ratio
    from tuneup.plugins.kernels.trust_ratio import is_excluded

    if found_inf is not None and found_inf.item() != 0:
        return
    beta1, beta2 = group["betas"]
    grads = _unscaled(params, grad_scale)
    steps = [s["step"] for s in states]
    exp_avgs, exp_avg_sqs = [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states]
    torch._foreach_add_(steps, 1)
    torch._foreach_mul_(exp_avgs, beta1)
    torch._foreach_add_(exp_avgs, grads, alpha=1 - beta1)
    torch._foreach_mul_(exp_avg_sqs, beta2)
    torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1 - beta2)
    bias1 = torch._foreach_add(torch._foreach_neg(torch._foreach_pow(beta1, steps)), 1)
    bias2 = torch._foreach_add(torch._foreach_neg(torch._foreach_pow(beta2, steps)), 1)
    denominators = torch._foreach_sqrt(torch._foreach_div(exp_avg_sqs, bias2))
    torch._foreach_add_(denominators, group["eps"])
    updates = torch._foreach_div(torch._foreach_div(exp_avgs, bias1), denominators)
    decayed = [i for i, p in enumerate(params) if not is_excluded(group, p)]
    if decayed:
        weights, scaled = [params[i] for i in decayed], [updates[i] for i in decayed]
        torch._foreach_add_(scaled, weights, alpha=group["weight_decay"])
        norms = [torch.stack(torch._foreach_norm(tensors)) for tensors in (weights, scaled)]
        ratios = trust_ratio(*norms, group["trust_clip"])
        torch._foreach_mul_(scaled, list(ratios.unbind()))
    torch._foreach_add_(params, updates, alpha=-group["lr"])


def lars_foreach(group, params, buffers, grad_scale, found_inf):
    """LARS's update (plugins/kernels/lars.py) with torch._foreach ops over all tensors."""
    import torch

    from tuneup.plugins.kernels.lars import local_lr
    from tuneup.plugins.kernels.trust_ratio import is_excluded

    if found_inf is not None and found_inf.item() != 0:
        return
    grads = _unscaled(params, grad_scale)
    adapted = [i for i, p in enumerate(params) if not is_excluded(group, p)]
    plain = [i for i, p in enumerate(params) if is_excluded(group, p)]
    updates = list(grads)
    if adapted:
        weights, grads_in = [params[i] for i in adapted], [grads[i] for i in adapted]
        local = local_lr(
            group,
            torch.stack(torch._foreach_norm(weights)),
            torch.stack(torch._foreach_norm(grads_in)),
        )
        scaled = torch._foreach_add(grads_in, weights, alpha=group["weight_decay"])
        torch._foreach_mul_(scaled, list((group["lr"] * local).unbind()))
        for i, update in zip(adapted, scaled, strict=True):
            updates[i] = update
    if plain:  # biases and norms: plain momentum SGD
        for i, update in zip(
            plain, torch._foreach_mul([grads[i] for i in plain], group["lr"]), strict=True
        ):
            updates[i] = update
    torch._foreach_mul_(buffers, group["momentum"])
    torch._foreach_add_(buffers, updates)
    torch._foreach_sub_(params, buffers)
