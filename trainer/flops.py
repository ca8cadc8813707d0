"""FLOPs of a training step, and the device peaks that turn achieved TFLOP/s into MFU.

``flops_per_sample`` counts one forward, loss and backward with
``torch.utils.flop_counter.FlopCounterMode`` on a copy of the model built on
the *meta* device: shapes only, so it costs no compute, no memory, and leaves
the real model, its BatchNorm statistics, gradients and RNG untouched. The
copy is built from the config, before plugins transform the model, so the
count is the model's own arithmetic ("model FLOPs" in the PaLM paper's MFU):
recomputation under activation checkpointing, kernel swaps and compilation do
not change it. Only matrix products and convolutions are counted (what
FlopCounterMode knows), which is where the FLOPs of these models are. A model
that cannot run on the meta device (its forward reads a tensor's value, as
transformers' models do) is counted once on a real copy on the CPU instead
(:func:`count_flops`); where that fails too, ``mfu_note`` says why.

Attention is counted as it is computed: a causal ``scaled_dot_product_attention``
(``is_causal=True``, as model=gpt calls it) skips the masked half of the score
matrix, so half of its matmul FLOPs are counted, forward and backward (the
convention of FlashAttention's benchmarks). FlopCounterMode alone counts every
attention as unmasked, on the meta device (its two batched matmuls) and in its
flash-attention formulas alike; :class:`AttentionCalls` sees each call and the
count is corrected. An explicit ``attn_mask`` is counted as unmasked (its pattern
is not known).

MFU = achieved TFLOP/s / (peak TFLOP/s per device x devices), with the
device's dense 16-bit tensor-core peak whatever the run's precision (the
convention of nanoGPT and torchtitan): one yardstick per GPU, so fp32 and amp
runs are compared against the same ceiling.
"""

from __future__ import annotations

import re

import torch
from torch.nn import functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.overrides import TorchFunctionMode
from torch.utils.flop_counter import FlopCounterMode, bmm_flop

#: Dense (no sparsity) bf16 tensor-core peak per GPU, TFLOP/s, from NVIDIA's datasheets
#: (fp16 on V100 and T4, which have no bf16). Matched in this order, as whole words, against
#: ``torch.cuda.get_device_name()``, e.g. "NVIDIA H200", "NVIDIA A100-SXM4-80GB".
PEAK_TFLOPS = (
    ("H200 NVL", 835.5),
    ("H200", 989.4),  # H200 SXM
    ("GH200", 989.4),
    ("H100 PCIe", 756.5),
    ("H100 NVL", 835.5),
    ("H100", 989.4),  # H100 SXM
    ("A100", 312.0),  # SXM and PCIe, 40 and 80 GB
    ("L40S", 362.1),
    ("L40", 181.0),
    ("L4", 121.0),
    ("A10", 125.0),
    ("V100", 125.0),  # fp16, SXM2 (PCIe: 112)
    ("T4", 65.0),  # fp16
)


def peak_tflops(device_name: str) -> float | None:
    """The device's dense 16-bit peak in TFLOP/s, or None when it is not in :data:`PEAK_TFLOPS`."""
    for key, peak in PEAK_TFLOPS:
        if re.search(rf"(?<![\w-]){re.escape(key)}(?![\w])", device_name):
            return peak
    return None


def example_batch(data, batch_size: int = 2, device="meta") -> tuple[torch.Tensor, torch.Tensor]:
    """An ``(x, y)`` batch shaped like ``data``'s: images float ``[B, C, H, W]`` with ``[B]``
    labels, tokens int64 ``[B, T]`` with ``[B, T]`` targets (zeros: values do not matter)."""
    shape = (batch_size, *data.input_shape)
    if getattr(data, "inputs", "images") == "tokens":
        tokens = torch.zeros(shape, dtype=torch.long, device=device)
        return tokens, tokens.clone()
    x = torch.zeros(shape, device=device)
    return x, torch.zeros(batch_size, dtype=torch.long, device=device)


#: The largest model (fp32 parameter bytes) that :func:`count_flops` copies to the CPU to count
#: it with a real forward of one sample, when it cannot run on the meta device: GPT-2 small's
#: size, a few seconds on a CPU.
REAL_COPY_LIMIT = 2**29


def flops_per_sample(plan) -> float | None:
    """Model FLOPs of one training sample (forward + backward); None when they cannot be
    counted (:func:`count_flops` says why)."""
    return count_flops(plan)[0]


#: Counts made in this process, by :func:`architecture`: a sweep's jobs, an autotune's trials
#: and a test suite's runs train one architecture on one shape again and again, and a count
#: costs 60-120 ms on a CPU (FlopCounterMode dispatches every op in Python), a fifth of a tiny
#: run.
_counted: dict[str, tuple[float | None, str | None]] = {}


def architecture(plan) -> str | None:
    """What a zoo model's count depends on: its config, the data's shape and classes, the
    task; None (never cached) for the user's own model, whose code may change in a process,
    and for a model read from disk (``model=huggingface``)."""
    from omegaconf import OmegaConf

    if not plan.config_made:
        return None
    model = OmegaConf.to_yaml(plan.cfg.model, resolve=True)
    data = f"{plan.input_shape}|{plan.num_classes}|{plan.inputs}"
    return f"{model}|{data}|{plan.task.name}|{plan.task.class_dim}"


def count_flops(plan) -> tuple[float | None, str | None]:
    """:func:`count_flops_once`, counted once per :func:`architecture` in a process."""
    key = architecture(plan) if plan.sound else None
    if key is None:
        return count_flops_once(plan)
    if key not in _counted:
        _counted[key] = count_flops_once(plan)
    return _counted[key]


def count_flops_once(plan) -> tuple[float | None, str | None]:
    """(model FLOPs of one training sample, None) or (None, why they could not be counted).

    ``plan`` is the run's :class:`~tuneup.trainer.components.Plan`. Counted on its model on
    the meta device with a batch shaped like the data's. A model whose forward reads a
    tensor's value (transformers' models call ``.item()`` on their attention mask) cannot run
    there: it is then counted once on a real copy on the CPU, built from the config, on one
    sample, with the random number generators forked (the run's model, its RNG stream and
    device memory untouched), up to :data:`REAL_COPY_LIMIT` bytes of parameters.
    """
    model = plan.meta_model()
    if model is None:
        cause = plan.meta_error
        return None, "the model cannot be built on the meta device" + (
            f" ({type(cause).__name__}: {cause})" if cause is not None else ""
        )
    try:
        return _count(plan, model, plan.example_batch()), None
    except Exception as exc:  # a measurement must never stop a run; mfu_note says why
        meta_failure = f"{type(exc).__name__}: {exc}".splitlines()[0]
    size = sum(p.numel() for p in model.parameters()) * 4
    if size > REAL_COPY_LIMIT:
        return None, (
            f"the model does not run on the meta device ({meta_failure}), and at "
            f"{size / 2**30:.1f} GiB is too large to count on a CPU copy"
        )
    try:  # the math attention: FlopCounterMode does not count the CPU's fused kernel
        with torch.random.fork_rng(devices=[]), sdpa_kernel(SDPBackend.MATH):
            real = plan.build_model()
            return _count(plan, real, first_samples(plan.example_batch(device="cpu"), 1)), None
    except Exception as exc:
        return None, (
            f"the model does not run on the meta device ({meta_failure}), nor on "
            f"the CPU: {type(exc).__name__}: {exc}".splitlines()[0]
        )


def first_samples(batch, n: int):
    """``batch`` cut to its first ``n`` samples (every tensor in it, along dim 0)."""
    if isinstance(batch, torch.Tensor):
        return batch[:n]
    if isinstance(batch, (list, tuple)):
        return type(batch)(first_samples(item, n) for item in batch)
    if isinstance(batch, dict):
        return {key: first_samples(value, n) for key, value in batch.items()}
    return batch


def _count(plan, model, batch) -> float:
    """FLOPs per sample of one forward, loss and backward of ``model`` on ``batch``."""
    from tuneup.trainer import task as tasks
    from tuneup.trainer.batches import first_tensor

    model.train()
    size = len(first_tensor(batch))  # FLOPs are linear in the batch
    with FlopCounterMode(display=False) as counter, AttentionCalls() as attention:
        if plan.lightning:  # its forward; what else its training_step does is not counted
            x = batch[0] if isinstance(batch, (list, tuple)) else batch
            loss = model(x).float().sum()
        elif plan.task.model_loss:
            loss = tasks.returned_loss(tasks.call_model(model, batch))
        else:
            logits = tasks.logits_of(tasks.forward(model, batch[0]))
            loss = plan.task.loss_fn(logits, batch[1])
        loss.backward()
    return (counter.get_total_flops() - attention.masked_flops()) / size


class AttentionCalls(TorchFunctionMode):
    """Notes each causal ``F.scaled_dot_product_attention`` call, for :meth:`masked_flops`."""

    def __init__(self) -> None:
        super().__init__()
        self.causal: list[tuple] = []  # (q, k, v) of each causal call

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal")
            call = dict(zip(names, args, strict=False)) | kwargs
            if call.get("is_causal") and call.get("attn_mask") is None:
                self.causal.append((call["query"], call["key"], call["value"]))
        return func(*args, **kwargs)

    def masked_flops(self) -> float:
        """FLOPs FlopCounterMode counted for the masked half of the causal calls' matmuls.

        It counts ``q @ k^T`` and ``p @ v`` forward, and in backward the matmuls for the
        gradients that are needed (p's for q or k, v's, q's, k's), all at full size.
        """
        masked = 0.0
        for q, k, v in self.causal:
            batch = q.shape[:-2].numel()
            scores = bmm_flop((batch, q.shape[-2], q.shape[-1]), (batch, q.shape[-1], k.shape[-2]))
            mixing = bmm_flop((batch, q.shape[-2], k.shape[-2]), (batch, k.shape[-2], v.shape[-1]))
            q_grad, k_grad, v_grad = q.requires_grad, k.requires_grad, v.requires_grad
            backward = mixing * ((q_grad or k_grad) + v_grad) + scores * (q_grad + k_grad)
            masked += (scores + mixing + backward) / 2
        return masked


def throughput(
    flops: float | None,
    samples_per_s: float | None,
    device_name: str,
    devices: int,
    flops_note: str | None = None,
) -> dict:
    """``flops_per_sample``, ``achieved_tflops`` (all devices), ``mfu`` and ``peak_tflops``
    (per device), and ``mfu_note`` saying why MFU is missing when it is (``flops_note``: why
    the FLOPs could not be counted, from :func:`count_flops`)."""
    achieved = flops * samples_per_s / 1e12 if flops and samples_per_s else None
    peak = peak_tflops(device_name or "")
    figures = {
        "flops_per_sample": flops,
        "achieved_tflops": achieved,
        "peak_tflops": peak,
        "mfu": achieved / (peak * devices) if achieved and peak else None,
    }
    if figures["mfu"] is None:
        figures["mfu_note"] = (
            f"FLOPs could not be counted: {flops_note or 'the model cannot run on the meta device'}"
            if not flops
            else "no measured samples/s"
            if not samples_per_s
            else f"no known peak for device {device_name!r} (trainer/flops.py PEAK_TFLOPS)"
        )
    return figures
