"""Memory by phase of one training step, for `bench_lora_phases.py`: resident size and peak per
phase from /proc (`PhaseMeter`, `wrap_phase`), glibc malloc's held memory (`malloc_totals_mb`),
and live tensor bytes by category at each phase's peak from torch's memory profiler
(`profiled_step_start`, `tensor_phases`). Linux only.
"""

from __future__ import annotations

import functools
import os
import re
import sys
from pathlib import Path
from typing import Any


def status_mb(field: str) -> float:
    """A memory field of /proc/self/status (`VmRSS`, `VmHWM`) in MiB (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024.0
    raise RuntimeError(f"no {field} in /proc/self/status")


def malloc_totals_mb() -> dict[str, float]:
    """glibc malloc's totals over every arena (`malloc_stats`, mmapped chunks included): `system`
    (what malloc holds from the kernel), `in_use`, and `free_held` = system - in use (memory
    freed to malloc but not returned to the kernel; resident where it was touched). glibc prints
    32-bit counters: right below 4 GiB, as here."""
    import ctypes
    import tempfile

    libc = ctypes.CDLL("libc.so.6")
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+") as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            libc.malloc_stats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        tmp.seek(0)
        text = tmp.read()
    total = text.split("Total (incl. mmap):")[-1]
    system = int(re.search(r"system bytes\s*=\s*(\d+)", total).group(1))
    in_use = int(re.search(r"in use bytes\s*=\s*(\d+)", total).group(1))
    return {"malloc_system_mb": system / 2**20, "malloc_in_use_mb": in_use / 2**20,
            "malloc_free_held_mb": (system - in_use) / 2**20}


class PhaseMeter:
    """Resident memory by phase of one training step: at every boundary (`mark(next phase)`) the
    resident size (VmRSS) and the peak of the phase that ends (VmHWM, reset at each boundary
    through /proc/self/clear_refs, as `common.StepPeaks`). With `ranges`, every phase is also a
    `torch.profiler.record_function` range `phase:<name>` (for `tensor_phases`)."""

    def __init__(self) -> None:
        self.phases: list[dict[str, Any]] = []
        self.current: str | None = None
        self.ranges = False
        self._start = 0.0
        self._range = None

    @property
    def active(self) -> bool:
        return self.current is not None

    def start(self, phase: str, ranges: bool = False) -> None:
        self.phases, self.current, self.ranges = [], None, ranges
        self.mark(phase, force=True)

    def mark(self, phase: str | None, force: bool = False) -> None:
        if not (self.active or force):
            return
        now, peak = status_mb("VmRSS"), status_mb("VmHWM")
        if self.current is not None:
            self.phases.append({"phase": self.current, "rss_start_mb": self._start, "peak_mb": peak, "rss_end_mb": now})
        if self._range is not None:
            self._range.__exit__(None, None, None)
            self._range = None
        self.current, self._start = phase, now
        if phase is None:
            return
        Path("/proc/self/clear_refs").write_text("5")
        if self.ranges:
            import torch

            self._range = torch.profiler.record_function(f"phase:{phase}")
            self._range.__enter__()

    def stop(self) -> list[dict[str, Any]]:
        self.mark(None)
        return self.phases


def wrap_phase(obj: Any, name: str, meter: PhaseMeter, phase: Any, after: str | None) -> None:
    """Make `obj.name(...)` a phase of `meter`: `phase` (a name, or a callable giving it at call
    time) while it runs, `after` once it returns (None: the phase goes on until the next mark)."""
    original = getattr(obj, name)

    @functools.wraps(original)
    def wrapped(*args, **kwargs):
        meter.mark(phase() if callable(phase) else phase)
        try:
            return original(*args, **kwargs)
        finally:
            if after is not None:
                meter.mark(after)

    setattr(obj, name, wrapped)


def profiled_step_start():
    import torch

    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True,
                                  record_shapes=True, with_stack=True)
    prof.start()
    return prof


def tensor_phases(prof) -> dict[str, Any]:
    """Live tensor bytes (MiB) of a profiled step by category of torch's memory profiler
    (`parameter`, `optimizer_state`, `input`, `temporary`, `activation`, `gradient`,
    `autograd_detail`, `unknown`), at the step's peak and at the peak of each `phase:*` range."""
    from torch.profiler._memory_profiler import _CATEGORY_TO_INDEX, MemoryProfileTimeline

    times, sizes = MemoryProfileTimeline(prof._memory_profile())._coalesce_timeline("cpu")
    labels = {index + 1: "unknown" if category is None else category.name.lower()
              for category, index in _CATEGORY_TO_INDEX.items()}
    totals = [sum(row[1:]) for row in sizes]

    def at(i: int) -> dict[str, float]:
        return {"total_mb": totals[i] / 2**20, **{labels[j]: sizes[i][j] / 2**20 for j in sorted(labels)}}

    ranges = []
    results = prof.profiler.kineto_results
    for event in results.events():
        try:
            name = event.name()
        except UnicodeDecodeError:  # a few profiler events carry undecodable names
            continue
        if name.startswith("phase:"):
            ranges.append((name[len("phase:"):], event.start_ns() // 1000, event.end_ns() // 1000))
    out: dict[str, Any] = {"step_peak": at(max(range(len(totals)), key=totals.__getitem__)), "phases": []}
    for name, start, end in sorted(ranges, key=lambda r: r[1]):
        inside = [i for i, t in enumerate(times) if start <= t <= end]
        if inside:
            out["phases"].append({"phase": name, **at(max(inside, key=totals.__getitem__))})
    return out
