"""Give the heap memory that the C library keeps after `free` back to the operating system.

On CPU, glibc's `malloc` keeps freed blocks of a step's many sizes, so the resident set holds
memory no tensor uses (`benchmarks/RESULTS.md`, "Where `other` goes"). `malloc_trim(0)` returns
every whole free page, at the cost of page faults when the next phase allocates again;
`TrainingModule` calls it at a step's phase boundaries on CPU (`release_host_memory`; `layers`:
also before each decoder layer, `release_before_layers`). Without `malloc_trim` (not Linux, musl)
`release_freed_memory` returns False; under jemalloc or tcmalloc it trims glibc's heap only.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from typing import Any, Callable

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle
from transformers.modeling_layers import GradientCheckpointingLayer


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)  # the symbols the process already has: its own C library
    except OSError:
        return None
    trim = getattr(libc, "malloc_trim", None)
    if trim is None:
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def available() -> bool:
    """Whether this process's C library can hand freed heap back (glibc's `malloc_trim`)."""
    return _malloc_trim() is not None


def release_freed_memory() -> bool:
    """Return the freed heap the C library holds to the operating system (`malloc_trim(0)`).

    Returns True when memory was released, False when there was none to release or the C
    library has no `malloc_trim`. Live allocations are untouched: only pages no block uses."""
    trim = _malloc_trim()
    return bool(trim(0)) if trim is not None else False


def release_before_layers(model: nn.Module) -> list[RemovableHandle]:
    """A forward pre-hook on every decoder layer in `model` (transformers'
    `GradientCheckpointingLayer`) that releases the freed heap before the layer runs with
    gradients enabled: in a training forward pass and, with gradient checkpointing, its
    recomputation in the backward pass. Passes without gradients (generation, frozen models'
    scoring) are left alone. Returns the hooks' handles (empty: no such layers)."""
    return [layer.register_forward_pre_hook(_release_if_grad) for layer in model.modules()
            if isinstance(layer, GradientCheckpointingLayer)]


def _release_if_grad(layer: nn.Module, args: Any) -> None:
    if torch.is_grad_enabled():
        release_freed_memory()
