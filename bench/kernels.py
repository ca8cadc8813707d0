"""tuneup's kernel ops against Liger-Kernel's, torch eager and torch.compile, in one run.

    python bench/kernels.py                      # on a CUDA GPU: every table
    python bench/kernels.py --only ce,lce        # some sections: ce, lce, optim, fp8
    python bench/kernels.py --smoke              # tiny sizes on CPU, Triton's interpreter

Sections, each a Markdown table:

- ce: cross-entropy of 16,384 rows of bf16 logits at 32k and 128k classes: tuneup's fused op,
  Liger's (when liger-kernel is installed), torch eager and torch.compile'd, forward+backward
  (through autograd, as training runs it) and forward only; bandwidth as a fraction of the copy
  bandwidth measured in the same run. Then tuneup's loss+gradient kernel alone under other
  launch configurations (plugins/kernels/cross_entropy_rows.py ``Launch``), to pick the fastest.
- lce: linear + cross-entropy, 16,384 x 2,048 -> 32k and 128k: the same four, with peak memory
  beyond the inputs; then tuneup's op at other chunk sizes.
- optim: one LAMB / LARS step over a BERT-large-like parameter set (24 layers of width 1024 and
  the embeddings, 334M fp32 values): tuneup's fused Triton step, the per-parameter eager loop
  (the reference), a torch._foreach version (below) and torch.compile of the reference.
- fp8: what precision=fp8 does to one linear layer, forward+backward under bf16 autocast and
  torch.compile, at GPT-2 small's MLP shapes and a large square one: bf16 against torchao's
  float8 (tensorwise, rowwise). Needs compute capability >= 8.9 and torchao.

Times are medians of triton.testing.do_bench (warm-up first, L2 flushed before each run).
Bandwidth counts the bytes that must move (inputs read once, outputs written once). The
targets of the issue are checked at the end: cross-entropy loss + gradient (the op's forward
kernel, which writes the gradient; the backward then scales it by the incoming gradient, one
more pass over the logits' size that the fwd+bwd rows include) >= 80% of copy bandwidth;
linear + CE forward+backward no slower than Liger's and compiled unfused, at <= 1/4
of the unfused head's peak memory; fused optimizer step >= 3x the eager loop and no slower
than the compiled one.

--smoke runs every path once at tiny sizes (torch.compile with the eager backend: Dynamo traces,
nothing is generated; the Triton kernels and Liger's under the interpreter) and reports no
timings. The compiled paths themselves are tested under aot_eager in tests/kernels/.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sections' modules beside this one
# (run as ``python bench/kernels.py`` this directory is on the path already; imported by the tests
# from its file, it is not)

from kernels_loss import LossCases  # noqa: E402
from kernels_optim import OptimCases  # noqa: E402

SECTIONS = ("ce", "lce", "optim", "fp8")

GPU_SIZES = dict(
    copy_bytes=2**30,
    ce_rows=16384,
    ce_vocab=[32768, 128256],
    head_rows=16384,
    head_width=2048,
    head_vocab=[32768, 128256],
    chunk_sizes=[1024, 2048, 8192],
    opt_width=1024,
    opt_layers=24,
    opt_vocab=30522,
    fp8_shapes=[(16384, 768, 3072), (16384, 3072, 768), (16384, 4096, 4096)],
)
SMOKE_SIZES = dict(
    copy_bytes=2**20,
    ce_rows=16,
    ce_vocab=[100],
    head_rows=24,
    head_width=8,
    head_vocab=[50],
    chunk_sizes=[8],
    opt_width=16,
    opt_layers=1,
    opt_vocab=40,
    fp8_shapes=[(32, 16, 32)],
)


def main(argv=None) -> None:
    args = parse_args(argv)
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
    Bench(smoke=args.smoke, sections=args.only).run()


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on CPU, no timings")
    parser.add_argument(
        "--only",
        type=lambda s: s.split(","),
        default=list(SECTIONS),
        help=f"comma-separated sections of {', '.join(SECTIONS)}",
    )
    args = parser.parse_args(argv)
    unknown = set(args.only) - set(SECTIONS)
    if unknown:
        parser.error(f"--only: unknown sections {sorted(unknown)}; known: {', '.join(SECTIONS)}")
    return args


def liger_functional():
    """Liger-Kernel's functional API, or None where liger-kernel is not installed."""
    try:
        from liger_kernel.transformers import functional
    except ImportError:
        return None
    return functional


class Bench(LossCases, OptimCases):
    """Runs the sections, prints a Markdown table per section, then the target checks.

    Here: the sizes, the timing, the rows and checks, the copy bandwidth and the fp8 section; the
    loss sections' cases are in bench/kernels_loss.py, the optimizer's in bench/kernels_optim.py.
    """

    def __init__(self, smoke: bool, sections=SECTIONS):
        import torch
        import triton.testing

        import tuneup.plugins.kernels as kernels

        self.torch, self.kernels, self.do_bench = torch, kernels, triton.testing.do_bench
        self.smoke, self.sections = smoke, sections
        self.sizes = SMOKE_SIZES if smoke else GPU_SIZES
        self.device = "cpu" if smoke else "cuda"
        self.compile_backend = "eager" if smoke else "inductor"  # aot_eager: +5 CPU-s a smoke run
        self.liger = liger_functional()
        self.checks: list[tuple[str, bool | None]] = []
        self.copy_bandwidth = math.nan

    def run(self) -> None:
        context = self.kernels.triton_on_cpu() if self.smoke else contextlib.nullcontext()
        device_name = (
            "CPU (Triton interpreter)" if self.smoke else self.torch.cuda.get_device_name()
        )
        liger = "not installed" if self.liger is None else _version("liger-kernel")
        print(f"device: {device_name}; torch {self.torch.__version__}; liger-kernel {liger}")
        with context:
            self.copy_bandwidth = self.bench_copy()
            if "ce" in self.sections:
                self.table("cross-entropy", self.bench_cross_entropy, self.sizes["ce_vocab"])
                launches = "cross-entropy launches (tuneup's loss+grad kernel)"
                self.table(launches, self.sweep_launch, self.sizes["ce_vocab"])
            if "lce" in self.sections:
                self.table("linear + cross-entropy", self.bench_linear_ce, self.sizes["head_vocab"])
            if "optim" in self.sections:
                self.table("optimizer step", self.bench_optimizer, ("Lamb", "Lars"))
            if "fp8" in self.sections:
                self.table("fp8: one linear layer", self.bench_fp8, self.sizes["fp8_shapes"])
        print("\nwhich implementation each op ran:", dict(sorted(self.kernels.ran.items())))
        print("\n| target | value | verdict |\n|---|---|---|")
        for description, passed in self.checks:
            verdict = "n/a (smoke)" if passed is None else ("PASS" if passed else "FAIL")
            print(f"| {description} | {verdict} |")

    # -- measurement -------------------------------------------------------------------------

    def time_ms(self, fn: Callable[[], object], grad_to_none=None) -> float:
        """Median milliseconds of `fn`; in smoke mode runs it once and returns nan."""
        if self.smoke:
            fn()
            return math.nan
        return self.do_bench(
            fn, warmup=50, rep=400, grad_to_none=grad_to_none, return_mode="median"
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

    def row(self, op, implementation, mode, ms, moved=math.nan, note="") -> str:
        gb_per_s = moved / (ms * 1e-3) / 1e9
        percent = 100 * self.fraction_of_copy(moved, ms)
        bandwidth = f"{gb_per_s:.0f} | {percent:.0f}%" if moved == moved else " | "
        return f"| {op} | {implementation} | {mode} | {ms:.3f} | {bandwidth} | {note} |"

    def table(self, title: str, bench: Callable[[object], list[str]], cases) -> None:
        """A Markdown table of the rows ``bench`` makes for each case, printed as they come."""
        print(f"\n### {title}\n")
        print("| op | implementation | mode | ms | GB/s | of copy | note |")
        print("|---|---|---|---:|---:|---:|---|", flush=True)
        for case in cases:
            print("\n".join(bench(case)), flush=True)

    def check(self, description: str, value: float, passed: bool) -> None:
        self.checks.append((f"{description} | {value:.3g}", None if self.smoke else passed))

    def compiled(self, fn):
        return self.torch.compile(fn, backend=self.compile_backend, dynamic=False)

    # -- copy ----------------------------------------------------------------------------------

    def bench_copy(self) -> float:
        source = self.torch.randn(self.sizes["copy_bytes"] // 4, device=self.device)
        target = self.torch.empty_like(source)
        ms = self.time_ms(lambda: target.copy_(source))
        bandwidth = 2 * source.nbytes / (ms * 1e-3)
        print(f"copy bandwidth: {bandwidth / 1e12:.2f} TB/s (read + write of {source.nbytes} B)")
        return bandwidth

    # -- fp8 ----------------------------------------------------------------------------------

    def bench_fp8(self, shape) -> list[str]:
        """A linear layer forward+backward in bf16 and in float8 (torchao), compiled."""
        torch = self.torch
        rows, d_in, d_out = shape
        op = f"linear {rows}x{d_in}->{d_out}"
        if not self.smoke and torch.cuda.get_device_capability() < (8, 9):
            return [f"| {op} | float8 | - | needs compute capability >= 8.9 | | | |"]
        try:
            from tuneup.plugins.precision.fp8 import fp8_config, torchao_float8
        except ImportError:
            return [f"| {op} | float8 | - | torchao not installed | | | |"]
        flops = 6 * rows * d_in * d_out
        variants = {"bf16": None, "float8 tensorwise": "tensorwise", "float8 rowwise": "rowwise"}
        out, times = [], {}
        for name, recipe in variants.items():
            layer = torch.nn.Linear(d_in, d_out, bias=False, device=self.device)
            if recipe is not None:
                config = fp8_config(recipe, emulate=self.smoke)
                layer = torchao_float8().convert_to_float8_training(layer, config=config)
            x = torch.randn(rows, d_in, device=self.device, requires_grad=True)
            # Each variant compiled afresh: one lambda's code for 9 layers passed Dynamo's limit
            # of 8 recompiles, and the 9th (float8 rowwise, 4096 square) ran eager at 0.39x bf16
            torch._dynamo.reset()
            step = self.compiled(lambda x, layer=layer: layer(x).sum())

            def forward_backward(step=step, x=x):
                with torch.autocast(self.device, dtype=torch.bfloat16):
                    loss = step(x)
                loss.backward()

            times[name] = self.time_ms(forward_backward, grad_to_none=[x, layer.weight])
            note = f"{flops / (times[name] * 1e-3) / 1e12:.0f} TFLOP/s"
            if recipe is not None:
                note += f", {times['bf16'] / times[name]:.2f}x bf16"
            out.append(self.row(op, name, "fwd+bwd", times[name], note=note))
        return out


def _version(package: str) -> str:
    import importlib.metadata

    return importlib.metadata.version(package)


if __name__ == "__main__":
    main()
