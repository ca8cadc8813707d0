"""Capture and restore the random number generators a training process draws from.

Python's ``random``, NumPy's global generator, torch's CPU generator and, when
CUDA is in use, the current device's generator. States are plain containers
and tensors, so they load with ``torch.load(weights_only=True)`` (NumPy's key
array is stored as a tensor). Every rank has its own states: under
``torch.distributed`` they are gathered so rank 0's checkpoint holds all of them.
"""

from __future__ import annotations

import random

import numpy as np
import torch


def capture() -> dict:
    """This process's generator states."""
    kind, key, pos, has_gauss, gauss = np.random.get_state()
    numpy = {"kind": kind, "key": torch.from_numpy(key.astype(np.int64)), "pos": int(pos)}
    numpy.update(has_gauss=int(has_gauss), gauss=float(gauss))
    state = {"python": random.getstate(), "numpy": numpy, "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def restore(state: dict) -> None:
    """Put the generators back as :func:`capture` found them."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    n = state["numpy"]
    key = n["key"].numpy().astype(np.uint32)
    np.random.set_state((n["kind"], key, n["pos"], n["has_gauss"], n["gauss"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def capture_all_ranks() -> list[dict]:
    """Every rank's states, indexed by global rank (a collective: call it on every rank)."""
    state = capture()
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return [state]
    states = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(states, state)
    return states


def for_rank(states: list[dict] | None, rank: int) -> dict | None:
    """The states saved for ``rank``; None when the checkpoint had none for it (more ranks now)."""
    if not states or rank >= len(states):
        return None
    return states[rank]
