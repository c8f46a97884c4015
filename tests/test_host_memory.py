"""`lit_rlhf.host_memory`: freed heap goes back to the system; live memory is untouched."""

from __future__ import annotations

import platform
import sys
from pathlib import Path

import torch

from lit_rlhf import host_memory


def resident_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_available_exactly_with_glibc():
    glibc = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"
    assert host_memory.available() is glibc


def test_freed_heap_returns_to_the_system_and_live_tensors_keep_their_values():
    assert host_memory.available()  # CI and this project's machines run glibc
    host_memory.release_freed_memory()
    # 4096 blocks of 32 KiB (below glibc's mmap threshold, so they live in the heap), filled so
    # their pages are resident; every other one freed, and a live block after them all keeps
    # glibc from trimming the heap's top on its own: 64 MiB of free pages held in the middle
    blocks = [torch.full((8192,), float(i)) for i in range(4096)]
    fence = torch.ones(8192)
    del blocks[::2]
    held = resident_mib()
    assert host_memory.release_freed_memory() is True
    released = held - resident_mib()
    assert released > 32, f"only {released:.1f} MiB of the ~64 MiB freed went back"
    assert all(torch.equal(b, torch.full((8192,), float(2 * i + 1))) for i, b in enumerate(blocks))
    assert torch.equal(fence, torch.ones(8192))
