"""Where each kernel op decides between its Triton kernel and its plain-PyTorch reference.

Triton is an optional extra: without it every op runs its reference. The decision is one rule
for all ops (`implementation`), and every op notes what it actually ran in `ran`, so callers can
report it rather than fall back silently.

Triton's interpreter (``TRITON_INTERPRET=1``) runs the kernels on CPU tensors; `triton_on_cpu`
routes CPU tensors to the kernels that way (tests, ``bench/kernels.py --smoke``). ``triton.jit``
reads the variable when a kernel is defined, so it must be set before ``plugins.kernels`` is
imported.

Kernels loop over a bound known only at run time (a row's classes, a chunk's elements) with
``while i < bound: ...; i += BLOCK``, not ``for i in range(0, bound, BLOCK)``: the interpreter
of Triton 3.6 and older (the GPU images' Triton) turns such a ``range`` bound into an int with
``int()`` of a one-element array, which NumPy >= 2.4 refuses ("only 0-dimensional arrays can be
converted to Python scalars"). Compiled, the two loops run alike: Triton software-pipelines
neither here (it pipelines loads that feed a ``dot``), see docs/kernels.md.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from typing import NamedTuple

import torch

TRITON = "triton"
REFERENCE = "reference"


def _import_triton():
    """Triton and triton.language, or (None, None) where the optional extra is not installed."""
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None, None
    return triton, tl


triton, tl = _import_triton()

#: Whether the kernels were defined for Triton's CPU interpreter (the variable is read once, here,
#: before the kernel modules that import this one define their kernels).
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"

#: Op name -> implementations it has run since import (or since a caller cleared it).
ran: dict[str, set[str]] = {}

_cpu_runs_triton = False


def implementation(device: torch.device | str) -> str:
    """``"triton"`` or ``"reference"``: what a kernel op runs for tensors on `device`."""
    device_type = torch.device(device).type
    if triton is None:
        return REFERENCE
    if device_type == "cuda" or (device_type == "cpu" and _cpu_runs_triton):
        return TRITON
    return REFERENCE


def record(op_name: str, implementation_name: str) -> None:
    """Note that `op_name` ran `implementation_name` (read by the plugin for its summary)."""
    ran.setdefault(op_name, set()).add(implementation_name)


@contextlib.contextmanager
def triton_on_cpu() -> Iterator[None]:
    """Run CPU tensors through the Triton kernels, under Triton's interpreter.

    Raises if Triton is missing or the kernels were defined without ``TRITON_INTERPRET=1``:
    compiled kernels cannot read CPU memory, and a test that silently ran the reference
    instead would prove nothing.
    """
    global _cpu_runs_triton
    if triton is None:
        raise RuntimeError("Triton is not installed: pip install triton")
    if not INTERPRETED:
        raise RuntimeError(
            "triton_on_cpu() needs TRITON_INTERPRET=1 set before plugins.kernels is imported"
        )
    previous, _cpu_runs_triton = _cpu_runs_triton, True
    try:
        yield
    finally:
        _cpu_runs_triton = previous


class PointerTable(NamedTuple):
    """How one multi-tensor kernel launch reaches many tensors (all int64, on the device).

    `addresses` is [tensors, columns] (e.g. param, grad, exp_avg, ...); `chunks` is
    [n_chunks, 2] of (tensor index, first element): one program per chunk.
    """

    addresses: torch.Tensor
    numels: torch.Tensor
    excluded: torch.Tensor
    chunks: torch.Tensor
    n_chunks: int


def launch_groups(params: Sequence[torch.Tensor]) -> list[list[int]]:
    """Indices of `params` that can share one multi-tensor launch: same param and grad dtypes
    (a kernel is compiled for one pointer type per column)."""
    groups: dict[tuple, list[int]] = {}
    for i, param in enumerate(params):
        groups.setdefault((param.dtype, param.grad.dtype), []).append(i)
    return list(groups.values())


def pointer_table(
    columns: Sequence[Sequence[torch.Tensor]], excluded: Sequence[bool], chunk_numel: int
) -> PointerTable:
    """Addresses, sizes and chunk list of tensors, copied to their device in one transfer.

    ``columns[k][i]`` is the k-th tensor of the i-th parameter; all of a row share a layout,
    so one flat index addresses the same element in each.
    """
    rows = list(zip(*columns, strict=True))
    device = columns[0][0].device
    for row in rows:
        if not all(t.is_contiguous() and t.device == device for t in row):
            raise ValueError(
                f"fused kernels need contiguous tensors on one device; got {tuple(row[0].shape)}"
            )
    numels = torch.tensor([row[0].numel() for row in rows], dtype=torch.int64)
    chunks_per_tensor = (numels + chunk_numel - 1) // chunk_numel
    tensor_of_chunk = torch.repeat_interleave(torch.arange(len(rows)), chunks_per_tensor)
    first_chunk = torch.cumsum(chunks_per_tensor, 0) - chunks_per_tensor
    starts = (torch.arange(len(tensor_of_chunk)) - first_chunk[tensor_of_chunk]) * chunk_numel
    host = torch.cat(
        [
            torch.tensor([t.data_ptr() for row in rows for t in row], dtype=torch.int64),
            numels,
            torch.tensor(excluded, dtype=torch.int64),
            torch.stack([tensor_of_chunk, starts], 1).flatten(),
        ]
    )
    table = host.to(device)
    n_tensors, n_columns = len(rows), len(columns)
    addresses, numels_d, excluded_d, chunks = table.split(
        [n_tensors * n_columns, n_tensors, n_tensors, 2 * len(tensor_of_chunk)]
    )
    return PointerTable(addresses, numels_d, excluded_d, chunks, len(tensor_of_chunk))


def require_triton(device: torch.device, user: str) -> None:
    """Raise unless tensors on `device` run Triton: for options such as ``fused=True``."""
    if implementation(device) != TRITON:
        installed = "installed" if triton is not None else "not installed"
        raise RuntimeError(
            f"{user} runs Triton kernels, which need CUDA tensors (got {device}; Triton "
            f"{installed}). Use fused=False for the reference implementation."
        )


if triton is not None:

    @triton.jit
    def program_chunk(chunks, numels, found_inf_ptr, HAS_FOUND_INF: tl.constexpr):
        """(tensor index, first element, numel) of this program's chunk of a `pointer_table`;
        numel is 0 when GradScaler found an inf (the whole step is skipped, no host sync)."""
        index = tl.load(chunks + 2 * tl.program_id(0))
        start = tl.load(chunks + 2 * tl.program_id(0) + 1)
        numel = tl.load(numels + index)
        if HAS_FOUND_INF:
            numel = tl.where(tl.load(found_inf_ptr) != 0, 0, numel)
        return index, start, numel

    @triton.jit
    def inverse_grad_scale(grad_scale_ptr, HAS_GRAD_SCALE: tl.constexpr):
        """1 / GradScaler's scale, to unscale gradients in the same pass (1 without AMP)."""
        inv_scale = 1.0
        if HAS_GRAD_SCALE:
            inv_scale = 1.0 / tl.load(grad_scale_ptr)
        return inv_scale
