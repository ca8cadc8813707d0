"""Benchmarks of tuneup's kernel ops against their eager and torch.compile'd references.

    python bench/kernels.py            # on a CUDA GPU, with Triton installed
    python bench/kernels.py --smoke    # tiny sizes on CPU under Triton's interpreter

Times are medians of triton.testing.do_bench (warm-up first, L2 flushed before each run),
each variant on freshly generated random inputs. Bandwidth is bytes that must move (inputs
read once, outputs written once) over time, as a fraction of the copy bandwidth measured here.
Targets from the issue: forward passes >= 80% of copy bandwidth, fused optimizer step >= 3x
faster than the per-parameter eager loop, linear + CE peak memory <= 1/4 of the unfused head.

--smoke runs every code path once at tiny sizes (torch.compile with the aot_eager backend) and
reports no timings: it proves the script works, not the kernels' speed.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

GPU_SIZES = dict(
    copy_bytes=2**30,
    ce_rows=16384,
    ce_vocab=[32768, 128256],
    head_rows=16384,
    head_width=2048,
    head_vocab=32768,
    opt_width=1024,
    opt_layers=12,
)
SMOKE_SIZES = dict(
    copy_bytes=2**20,
    ce_rows=16,
    ce_vocab=[100],
    head_rows=24,
    head_width=8,
    head_vocab=50,
    opt_width=16,
    opt_layers=2,
)


def main() -> None:
    args = parse_args()
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"  # read when plugins.kernels defines the kernels
    import torch

    if not args.smoke and not torch.cuda.is_available():
        sys.exit(
            "bench/kernels.py needs a CUDA GPU and found none. To check the code paths on CPU: "
            "python bench/kernels.py --smoke"
        )
    try:
        import triton  # noqa: F401
    except ImportError:
        sys.exit("bench/kernels.py needs Triton: pip install triton")

    bench = Bench(smoke=args.smoke)
    bench.run()


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on CPU, no timings")
    return parser.parse_args()


class Bench:
    """Runs each benchmark and prints one line per measurement, then the target checks."""

    def __init__(self, smoke: bool):
        import torch
        import triton.testing

        import tuneup.plugins.kernels as kernels

        self.torch, self.kernels, self.do_bench = torch, kernels, triton.testing.do_bench
        self.smoke = smoke
        self.sizes = SMOKE_SIZES if smoke else GPU_SIZES
        self.device = "cpu" if smoke else "cuda"
        self.compile_backend = "aot_eager" if smoke else "inductor"
        self.checks: list[tuple[str, bool | None]] = []
        self.copy_bandwidth = math.nan

    def run(self) -> None:
        context = self.kernels.triton_on_cpu() if self.smoke else contextlib.nullcontext()
        device_name = (
            "CPU (Triton interpreter)" if self.smoke else self.torch.cuda.get_device_name()
        )
        print(f"device: {device_name}")
        with context:
            self.copy_bandwidth = self.bench_copy()
            for vocab in self.sizes["ce_vocab"]:
                self.bench_cross_entropy(vocab)
            self.bench_linear_cross_entropy()
            for name in ("Lamb", "Lars"):
                self.bench_optimizer(name)
        print("\nwhich implementation each op ran:", dict(sorted(self.kernels.ran.items())))
        for description, passed in self.checks:
            verdict = "n/a (smoke)" if passed is None else ("PASS" if passed else "FAIL")
            print(f"{verdict:>12}  {description}")

    # -- measurement -------------------------------------------------------------------------

    def time_ms(self, fn: Callable[[], object], grad_to_none=None) -> float:
        """Median milliseconds of `fn`; in smoke mode runs it once and returns nan."""
        if self.smoke:
            fn()
            return math.nan
        return self.do_bench(
            fn, warmup=50, rep=500, grad_to_none=grad_to_none, return_mode="median"
        )

    def peak_bytes(self, fn: Callable[[], object]) -> float:
        """Memory `fn` allocates at its peak beyond what was allocated before it (CUDA only)."""
        if self.smoke:
            fn()
            return math.nan
        cuda = self.torch.cuda
        cuda.synchronize()
        before = cuda.memory_allocated()
        cuda.reset_peak_memory_stats()
        fn()
        cuda.synchronize()
        return cuda.max_memory_allocated() - before

    def fraction_of_copy(self, moved_bytes: float, ms: float) -> float:
        return moved_bytes / (ms * 1e-3) / self.copy_bandwidth

    def report(self, op: str, variant: str, ms: float, moved_bytes: float = math.nan, note=""):
        gb_per_s = moved_bytes / (ms * 1e-3) / 1e9
        percent = 100 * self.fraction_of_copy(moved_bytes, ms)
        print(f"{op:<36} {variant:<24} {ms:9.3f} ms {gb_per_s:8.1f} GB/s {percent:5.1f}% {note}")

    def check(self, description: str, value: float, passed: bool) -> None:
        self.checks.append((f"{description}: {value:.3g}", None if self.smoke else passed))

    # -- benchmarks ----------------------------------------------------------------------------

    def bench_copy(self) -> float:
        source = self.torch.randn(self.sizes["copy_bytes"] // 4, device=self.device)
        target = self.torch.empty_like(source)
        ms = self.time_ms(lambda: target.copy_(source))
        bandwidth = 2 * source.nbytes / (ms * 1e-3)
        print(f"copy bandwidth: {bandwidth / 1e12:.2f} TB/s (read + write of {source.nbytes} B)")
        return bandwidth

    def bench_cross_entropy(self, vocab: int) -> None:
        torch = self.torch
        ce = importlib.import_module("tuneup.plugins.kernels.cross_entropy")
        rows, dtype = self.sizes["ce_rows"], torch.bfloat16
        op = f"cross_entropy {rows}x{vocab} bf16"
        logits_bytes = rows * vocab * dtype.itemsize

        def inputs():
            logits = torch.randn(rows, vocab, device=self.device, dtype=dtype)
            return logits, torch.randint(0, vocab, (rows,), device=self.device)

        def reference(logits, target):
            """The op's plain-PyTorch path: loss and gradient, as the fused forward makes."""
            n_valid = (target != -100).sum()
            grad = torch.empty_like(logits)
            losses = ce.cross_entropy_rows(logits, target, n_valid, 0.0, -100, grad, "reference")
            return losses.sum() / n_valid, grad

        compiled = torch.compile(reference, backend=self.compile_backend)
        variants = {
            "triton loss+grad": lambda logits, target: ce.cross_entropy_op(
                logits, target, 0.0, -100, True
            ),
            "eager reference": reference,
            "compiled reference": compiled,
        }
        for variant, fn in variants.items():
            ms = self.time_ms(functools.partial(fn, *inputs()))
            self.report(op, variant, ms, 2 * logits_bytes)
            if variant.startswith("triton"):
                fraction = self.fraction_of_copy(2 * logits_bytes, ms)
                self.check(f"{op} forward (loss+grad), fraction of copy", fraction, fraction >= 0.8)
        logits, target = inputs()
        ms = self.time_ms(lambda: ce.cross_entropy_op(logits, target, 0.0, -100, False))
        self.report(op, "triton loss only", ms, logits_bytes)
        fraction = self.fraction_of_copy(logits_bytes, ms)
        self.check(f"{op} forward (loss only), fraction of copy", fraction, fraction >= 0.8)

    def bench_linear_cross_entropy(self) -> None:
        torch, F = self.torch, self.torch.nn.functional
        rows, width, vocab = (self.sizes[k] for k in ("head_rows", "head_width", "head_vocab"))
        op = f"linear_cross_entropy {rows}x{width}->{vocab}"

        def inputs():
            options = dict(device=self.device, dtype=torch.bfloat16)
            hidden = torch.randn(rows, width, **options).requires_grad_()
            weight = (torch.randn(vocab, width, **options) / width**0.5).requires_grad_()
            return hidden, weight, torch.randint(0, vocab, (rows,), device=self.device)

        def fused(hidden, weight, target):
            self.kernels.linear_cross_entropy(hidden, weight, target).backward()

        def unfused(hidden, weight, target):
            F.cross_entropy(hidden @ weight.T, target).backward()

        variants = {
            "triton fwd+bwd": fused,
            "eager unfused fwd+bwd": unfused,
            "compiled unfused fwd+bwd": torch.compile(unfused, backend=self.compile_backend),
        }
        flops = 6 * rows * width * vocab
        peaks = {}
        for variant, fn in variants.items():
            hidden, weight, target = inputs()
            ms = self.time_ms(functools.partial(fn, hidden, weight, target), [hidden, weight])
            peaks[variant] = self.peak_bytes(functools.partial(fn, *inputs()))
            tflops = flops / (ms * 1e-3) / 1e12
            self.report(op, variant, ms, note=f"{tflops:.1f} TFLOP/s, peak {peaks[variant]:.3g} B")
        ratio = peaks["triton fwd+bwd"] / peaks["eager unfused fwd+bwd"]
        self.check(f"{op} peak memory, fused / unfused", ratio, ratio <= 0.25)

    def bench_optimizer(self, name: str) -> None:
        torch = self.torch
        optimizer_class = getattr(self.kernels, name)
        shapes = transformer_shapes(self.sizes["opt_width"], self.sizes["opt_layers"])
        numel = sum(math.prod(s) for s in shapes)
        op = f"{name} step ({len(shapes)} tensors, {numel / 1e6:.2f}M fp32)"
        moved = (7 if name == "Lamb" else 5) * 4 * numel  # param, grad, state: reads + writes

        def optimizer(fused):
            params = [torch.randn(s, device=self.device).requires_grad_() for s in shapes]
            for param in params:
                param.grad = torch.randn_like(param)
            return optimizer_class(params, lr=1e-3, fused=fused)

        steps = {
            "triton fused": optimizer(fused=True).step,
            "eager per-parameter": optimizer(fused=False).step,
            "compiled reference": torch.compile(
                optimizer(fused=False).step, backend=self.compile_backend
            ),
        }
        times = {variant: self.time_ms(step) for variant, step in steps.items()}
        for variant, ms in times.items():
            self.report(op, variant, ms, moved)
        speedup = times["eager per-parameter"] / times["triton fused"]
        self.check(f"{op} speed-up of fused over eager", speedup, speedup >= 3)


def transformer_shapes(width: int, layers: int) -> list[tuple[int, ...]]:
    """Parameter shapes of a GPT-style stack: matrices, biases and norm scales."""
    per_layer = [(3 * width, width), (width, width), (4 * width, width), (width, 4 * width)]
    per_layer += [(3 * width,), (4 * width,)] + [(width,)] * 6
    return [shape for _ in range(layers) for shape in per_layer]


if __name__ == "__main__":
    main()
