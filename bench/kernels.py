"""tuneup's kernel ops against Liger-Kernel's, torch eager and torch.compile, in one run.

    python bench/kernels.py                      # on a CUDA GPU: every table
    python bench/kernels.py --only ce,lce        # some sections: ce, lce, optim, fp8
    python bench/kernels.py --smoke              # tiny sizes on CPU, Triton's interpreter

Sections, each a Markdown table:

- ce: cross-entropy of 16,384 rows of bf16 logits at 32k and 128k classes: tuneup's fused op,
  Liger's (when liger-kernel is installed), torch eager and torch.compile'd, forward+backward
  (through autograd, as training runs it) and forward only; bandwidth as a fraction of the copy
  bandwidth measured in the same run. Then tuneup's loss+gradient kernel alone under other
  launch configurations (plugins/kernels/cross_entropy.py ``Launch``), to pick the fastest.
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

--smoke runs every path once at tiny sizes (torch.compile with the aot_eager backend, the
Triton kernels and Liger's under the interpreter) and reports no timings.
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
    parser.add_argument("--only", type=lambda s: s.split(","), default=list(SECTIONS),
                        help=f"comma-separated sections of {', '.join(SECTIONS)}")  # fmt: skip
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


class Bench:
    """Runs the sections, prints a Markdown table per section, then the target checks."""

    def __init__(self, smoke: bool, sections=SECTIONS):
        import torch
        import triton.testing

        import tuneup.plugins.kernels as kernels

        self.torch, self.kernels, self.do_bench = torch, kernels, triton.testing.do_bench
        self.smoke, self.sections = smoke, sections
        self.sizes = SMOKE_SIZES if smoke else GPU_SIZES
        self.device = "cpu" if smoke else "cuda"
        self.compile_backend = "aot_eager" if smoke else "inductor"
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

    # -- cross-entropy ----------------------------------------------------------------------------

    def ce_inputs(self, vocab: int, requires_grad: bool):
        torch = self.torch
        logits = torch.randn(self.sizes["ce_rows"], vocab, device=self.device, dtype=torch.bfloat16)
        target = torch.randint(0, vocab, (self.sizes["ce_rows"],), device=self.device)
        return logits.requires_grad_(requires_grad), target

    def ce_losses(self) -> dict[str, Callable]:
        """Loss functions (logits, target) by implementation; Liger's where it is installed."""
        F = self.torch.nn.functional
        losses = {"tuneup": self.kernels.cross_entropy, "torch eager": F.cross_entropy,
                  "torch compiled": self.compiled(F.cross_entropy)}  # fmt: skip
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
        Launch = ce.Launch
        sms = 1 if self.smoke else self.torch.cuda.get_device_properties(0).multi_processor_count
        row_block = 1 << (vocab - 1).bit_length()
        candidates = {"default": None}
        if row_block <= ce.MAX_ONE_PASS:
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
            ce.LAUNCH = how
            try:
                times[name] = self.time_ms(
                    lambda: ce.cross_entropy_op(logits, target, 0.0, -100, True)
                )
            finally:
                ce.LAUNCH = None
            rows.append(self.row(op, "tuneup loss+grad kernel", name, times[name],
                                 2 * logits.nbytes))  # fmt: skip
        fraction = self.fraction_of_copy(2 * logits.nbytes, times["default"])
        self.check(f"{op} loss+grad kernel (the forward, which writes the gradient), fraction "
                   "of copy (>= 0.8)", fraction, fraction >= 0.8)  # fmt: skip
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

        losses = {"tuneup": self.kernels.linear_cross_entropy, "torch eager unfused": unfused,
                  "torch compiled unfused": self.compiled(unfused)}  # fmt: skip
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
            rows.append(self.row(op, f"tuneup chunk_size={chunk}", "fwd+bwd", ms,
                                 note=f"peak {peak / 2**30:.2f} GiB"))  # fmt: skip
        return rows

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
    return type(f"Foreach{optimizer_class.__name__}", (optimizer_class,),
                {"step_reference": staticmethod(step)})  # fmt: skip


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
        local = local_lr(group, torch.stack(torch._foreach_norm(weights)),
                         torch.stack(torch._foreach_norm(grads_in)))  # fmt: skip
        scaled = torch._foreach_add(grads_in, weights, alpha=group["weight_decay"])
        torch._foreach_mul_(scaled, list((group["lr"] * local).unbind()))
        for i, update in zip(adapted, scaled, strict=True):
            updates[i] = update
    if plain:  # biases and norms: plain momentum SGD
        for i, update in zip(plain, torch._foreach_mul([grads[i] for i in plain], group["lr"]),
                             strict=True):  # fmt: skip
            updates[i] = update
    torch._foreach_mul_(buffers, group["momentum"])
    torch._foreach_add_(buffers, updates)
    torch._foreach_sub_(params, buffers)


if __name__ == "__main__":
    main()
