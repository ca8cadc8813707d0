"""The loss sections of bench/kernels.py: cross-entropy (ce) and linear + cross-entropy (lce).

Their cases as methods of ``LossCases``, a mixin of bench/kernels.py's ``Bench``, which holds the
sizes, the timing (``time_ms``, ``peak_bytes``), the rows and the target checks these use. Imported
by bench/kernels.py, not run on its own.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable


class LossCases:
    """The ce and lce sections' cases (see bench/kernels.py's docstring for what they measure)."""

    # -- cross-entropy ----------------------------------------------------------------------------

    def ce_inputs(self, vocab: int, requires_grad: bool):
        torch = self.torch
        logits = torch.randn(self.sizes["ce_rows"], vocab, device=self.device, dtype=torch.bfloat16)
        target = torch.randint(0, vocab, (self.sizes["ce_rows"],), device=self.device)
        return logits.requires_grad_(requires_grad), target

    def ce_losses(self) -> dict[str, Callable]:
        """Loss functions (logits, target) by implementation; Liger's where it is installed."""
        F = self.torch.nn.functional
        losses = {
            "tuneup": self.kernels.cross_entropy,
            "torch eager": F.cross_entropy,
            "torch compiled": self.compiled(F.cross_entropy),
        }
        if self.liger is not None:
            losses["liger"] = lambda logits, target: self.liger.liger_cross_entropy(logits, target)
        return losses

    def bench_cross_entropy(self, vocab: int) -> list[str]:
        op = f"cross_entropy {self.sizes['ce_rows']}x{vocab} bf16"
        logits_bytes = self.sizes["ce_rows"] * vocab * 2
        rows = [] if self.liger is not None else [f"| {op} | liger | - | not installed | | | |"]
        for name, loss_fn in self.ce_losses().items():
            logits, target = self.ce_inputs(vocab, requires_grad=True)

            def forward_backward(loss_fn=loss_fn, logits=logits, target=target):
                loss_fn(logits, target).backward()

            ms = self.time_ms(forward_backward, grad_to_none=[logits])
            rows.append(self.row(op, name, "fwd+bwd", ms, 2 * logits_bytes))
            logits, target = self.ce_inputs(vocab, requires_grad=False)
            ms = self.time_ms(functools.partial(loss_fn, logits, target))
            rows.append(self.row(op, name, "fwd", ms, logits_bytes))
        return rows

    def sweep_launch(self, vocab: int) -> list[str]:
        """tuneup's loss+gradient kernel (the op's forward) under other launch configurations."""
        ce = importlib.import_module("tuneup.plugins.kernels.cross_entropy")
        ce_rows = importlib.import_module("tuneup.plugins.kernels.cross_entropy_rows")
        Launch = ce_rows.Launch
        sms = 1 if self.smoke else self.torch.cuda.get_device_properties(0).multi_processor_count
        row_block = 1 << (vocab - 1).bit_length()
        candidates = {"default": None}
        if row_block <= ce_rows.MAX_ONE_PASS:
            candidates["one pass, 16 warps"] = Launch(True, row_block, 16)
        for block, warps in ((2048, 8), (4096, 8), (8192, 16)):
            candidates[f"two passes of {block}, {warps} warps"] = Launch(False, block, warps)
        for per_sm in (1, 2, 4):
            candidates[f"two passes of 4096, 8 warps, {per_sm} per SM looping over rows"] = Launch(
                False, 4096, 8, programs=per_sm * sms
            )
        op = f"cross_entropy {self.sizes['ce_rows']}x{vocab} bf16"
        logits, target = self.ce_inputs(vocab, requires_grad=False)
        rows, times = [], {}
        for name, how in candidates.items():
            ce_rows.LAUNCH = how
            try:
                times[name] = self.time_ms(
                    lambda: ce.cross_entropy_op(logits, target, 0.0, -100, True)
                )
            finally:
                ce_rows.LAUNCH = None
            rows.append(
                self.row(op, "tuneup loss+grad kernel", name, times[name], 2 * logits.nbytes)
            )
        fraction = self.fraction_of_copy(2 * logits.nbytes, times["default"])
        self.check(
            f"{op} loss+grad kernel (the forward, which writes the gradient), fraction "
            "of copy (>= 0.8)",
            fraction,
            fraction >= 0.8,
        )
        if not self.smoke:
            fastest = min(times, key=times.get)
            rows.append(f"| {op} | fastest launch | {fastest} | {times[fastest]:.3f} | | | |")
        return rows

    # -- linear + cross-entropy ------------------------------------------------------------------

    def lce_inputs(self, vocab: int, requires_grad: bool):
        torch = self.torch
        rows, width = self.sizes["head_rows"], self.sizes["head_width"]
        options = dict(device=self.device, dtype=torch.bfloat16)
        hidden = torch.randn(rows, width, **options).requires_grad_(requires_grad)
        weight = (torch.randn(vocab, width, **options) / width**0.5).requires_grad_(requires_grad)
        return hidden, weight, torch.randint(0, vocab, (rows,), device=self.device)

    def lce_losses(self) -> dict[str, Callable]:
        F = self.torch.nn.functional

        def unfused(hidden, weight, target):
            return F.cross_entropy(hidden @ weight.T, target)

        losses = {
            "tuneup": self.kernels.linear_cross_entropy,
            "torch eager unfused": unfused,
            "torch compiled unfused": self.compiled(unfused),
        }
        if self.liger is not None:
            losses["liger"] = self.liger.liger_fused_linear_cross_entropy
        return losses

    def bench_linear_ce(self, vocab: int) -> list[str]:
        width, n = self.sizes["head_width"], self.sizes["head_rows"]
        op = f"linear_cross_entropy {n}x{width}->{vocab} bf16"
        flops = 6 * n * width * vocab
        rows = [] if self.liger is not None else [f"| {op} | liger | - | not installed | | | |"]
        times, peaks = {}, {}
        for name, loss_fn in self.lce_losses().items():
            hidden, weight, target = self.lce_inputs(vocab, requires_grad=True)

            def forward_backward(loss_fn=loss_fn, hidden=hidden, weight=weight, target=target):
                loss_fn(hidden, weight, target).backward()

            times[name] = self.time_ms(forward_backward, grad_to_none=[hidden, weight])
            hidden.grad = weight.grad = None
            peaks[name] = self.peak_bytes(forward_backward)
            tflops = flops / (times[name] * 1e-3) / 1e12
            note = f"{tflops:.0f} TFLOP/s, peak {peaks[name] / 2**30:.2f} GiB"
            rows.append(self.row(op, name, "fwd+bwd", times[name], note=note))
            hidden, weight, target = self.lce_inputs(vocab, requires_grad=False)
            ms = self.time_ms(functools.partial(loss_fn, hidden, weight, target))
            rows.append(
                self.row(op, name, "fwd", ms, note=f"{flops / 3 / (ms * 1e-3) / 1e12:.0f} TFLOP/s")
            )
        rows += self.sweep_chunks(op, vocab)
        ratio = peaks["tuneup"] / peaks["torch eager unfused"]
        self.check(f"{op} peak memory, tuneup / eager unfused (<= 0.25)", ratio, ratio <= 0.25)
        for rival in ("torch compiled unfused", "liger"):
            if rival in times:
                speed = times[rival] / times["tuneup"]
                self.check(f"{op} fwd+bwd, {rival} time / tuneup's (>= 1)", speed, speed >= 1)
        return rows

    def sweep_chunks(self, op: str, vocab: int) -> list[str]:
        """tuneup's op at other chunk sizes: fewer chunks add the weight gradient fewer times."""
        rows = []
        for chunk in self.sizes["chunk_sizes"]:
            hidden, weight, target = self.lce_inputs(vocab, requires_grad=True)

            def forward_backward(chunk=chunk, hidden=hidden, weight=weight, target=target):
                self.kernels.linear_cross_entropy(
                    hidden, weight, target, chunk_size=chunk
                ).backward()

            ms = self.time_ms(forward_backward, grad_to_none=[hidden, weight])
            hidden.grad = weight.grad = None
            peak = self.peak_bytes(forward_backward)
            rows.append(
                self.row(
                    op,
                    f"tuneup chunk_size={chunk}",
                    "fwd+bwd",
                    ms,
                    note=f"peak {peak / 2**30:.2f} GiB",
                )
            )
        return rows
