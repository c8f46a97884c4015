"""Versioned weight sync between the learner and a sampler that holds its own copy of the policy.

The learner `publish`es the weights of each policy version; a sampler `fetch`es exactly the
version it was scheduled to sample with (`lit_rlhf.async_rollouts.queue.sampling_version`).
Every call has a deadline and every failure is an error that says what went wrong:

- `WeightSyncTimeout`: the version was not published within the deadline (learner gone or slow);
- `WeightVersionError`: the version asked for was replaced by a newer one before it was fetched,
  a file stamped with another version, or versions published out of order;
- `WeightSyncError`: a transfer that keeps failing (an unreadable file after `retries` tries),
  or weights that do not fit the receiving model (names or shapes), named.

Two transports here, one interface (`WeightSync`):

- `InMemoryWeightSync`: a sampler thread in the learner's process (copies of the tensors);
- `FileWeightSync`: another process on the same machine: one safetensors file per version in a
  directory, written to a temporary name and renamed (a reader never sees half a file), the
  version stamped in the file's metadata and checked on reading, older files pruned.

What is sent (`trained_weights`): the parameters that train. For a LoRA policy that is the
`policy` adapter alone (its LoRA matrices and `modules_to_save` copies): the frozen base never
changes, so a sampler holding a copy of the whole LoRA model stays exact with the adapter only.
Sending to a vLLM engine in its own process, and the NCCL path on GPUs, is
`lit_rlhf.generation.server`.
"""

from __future__ import annotations

import os
import re
import threading
import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Mapping

import torch
from torch import Tensor, nn

from lit_rlhf.models import adapters

VERSION_KEY = "lit_rlhf_weight_version"
PROBE_KEY = "lit_rlhf.sync_probe.logps"  # the trainer's log-probs of the probe (`sync_check.SyncProbe.stamp`)
POLL_SECONDS = 0.05


class WeightSyncError(RuntimeError):
    """A weight transfer failed (see the module docstring)."""


class WeightSyncTimeout(WeightSyncError, TimeoutError):
    """The version asked for was not published within the deadline."""


class WeightVersionError(WeightSyncError):
    """The wrong version: replaced before it was fetched, mislabelled, or published out of order."""


def trained_weights(policy: nn.Module, adapter: str | None = None) -> dict[str, Tensor]:
    """{name: tensor} of what a sync sends: the parameters that train; for a LoRA (`peft`) policy,
    only those of `adapter` (default `policy`: its LoRA matrices and `modules_to_save` copies).
    The tensors are the live parameters (detached, not copied)."""
    if adapters.adapter_names(policy):
        marker = f".{adapter or adapters.POLICY}."
        out = {n: p.detach() for n, p in policy.named_parameters() if marker in n and p.requires_grad}
        if not out:
            raise WeightSyncError(f"the LoRA policy has no trainable parameters of adapter {adapter or adapters.POLICY!r}")
        return out
    return {n: p.detach() for n, p in policy.named_parameters() if p.requires_grad}


@torch.no_grad()
def load_weights(model: nn.Module, tensors: Mapping[str, Tensor]) -> None:
    """Copy `tensors` into `model`'s parameters of the same names; every name must exist with the
    same shape (else `WeightSyncError` naming them)."""
    params = dict(model.named_parameters())
    unknown = sorted(set(tensors) - set(params))
    shapes = sorted(n for n in set(tensors) & set(params) if tuple(tensors[n].shape) != tuple(params[n].shape))
    if unknown or shapes:
        raise WeightSyncError(f"the weights do not fit the sampler's model: unknown names {unknown[:5]}, "
                              f"shape mismatches {[(n, tuple(tensors[n].shape), tuple(params[n].shape)) for n in shapes[:5]]}")
    for name, tensor in tensors.items():
        params[name].copy_(tensor)


class WeightSync(ABC):
    """Publish and fetch policy versions (see the module docstring)."""

    @abstractmethod
    def publish(self, version: int, tensors: Mapping[str, Tensor]) -> None:
        """Make `tensors` available as `version` (strictly increasing)."""

    @abstractmethod
    def fetch(self, version: int, timeout: float) -> dict[str, Tensor]:
        """The tensors of exactly `version`, waiting at most `timeout` seconds for it."""

    def close(self) -> None:
        """Release what the transport holds."""


def _check_order(version: int, last: int | None) -> None:
    if last is not None and version <= last:
        raise WeightVersionError(f"version {version} published after version {last}: versions must increase")


class InMemoryWeightSync(WeightSync):
    """Versions as copies of the tensors in this process (a sampler thread). A fetched version
    and every older one are dropped, so at most the unfetched versions are held."""

    def __init__(self) -> None:
        self._versions: dict[int, dict[str, Tensor]] = {}
        self._last: int | None = None
        self._cond = threading.Condition()

    def publish(self, version: int, tensors: Mapping[str, Tensor]) -> None:
        copies = {n: t.detach().clone() for n, t in tensors.items()}
        with self._cond:
            _check_order(version, self._last)
            self._versions[version] = copies
            self._last = version
            self._cond.notify_all()

    def fetch(self, version: int, timeout: float) -> dict[str, Tensor]:
        deadline = time.perf_counter() + timeout
        with self._cond:
            while version not in self._versions:
                if self._last is not None and self._last > version:
                    raise WeightVersionError(f"weights of version {version} asked for, but versions up to {self._last} "
                                             f"were published and {version} is no longer held")
                left = deadline - time.perf_counter()
                if left <= 0:
                    raise WeightSyncTimeout(f"weights of version {version} not published after {timeout:.1f} s "
                                            f"(latest: {self._last})")
                self._cond.wait(min(left, 1.0))
            tensors = self._versions[version]
            for old in [v for v in self._versions if v < version]:
                del self._versions[old]
            return tensors

    def close(self) -> None:
        with self._cond:
            self._versions.clear()


class FileWeightSync(WeightSync):
    """Versions as safetensors files in `directory`, for a sampler in another process.

    Args:
        directory: shared by the learner (publishes) and the sampler (fetches).
        keep: files kept after a publish (the newest ones); a sampler scheduled `max_staleness`
            versions behind needs `max_staleness + 1`.
        retries: reads of an unreadable file before giving up.
    """

    PATTERN = re.compile(r"weights-v(\d{9})\.safetensors")

    def __init__(self, directory: str | Path, keep: int = 2, retries: int = 3) -> None:
        if keep < 1 or retries < 1:
            raise ValueError(f"keep and retries must be >= 1, got {keep} and {retries}")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.keep, self.retries = keep, retries

    def path(self, version: int) -> Path:
        return self.directory / f"weights-v{version:09d}.safetensors"

    def versions(self) -> list[int]:
        """The versions whose files are present, oldest first."""
        return sorted(int(m.group(1)) for p in self.directory.iterdir() if (m := self.PATTERN.fullmatch(p.name)))

    def publish(self, version: int, tensors: Mapping[str, Tensor]) -> None:
        from safetensors.torch import save_file

        present = self.versions()
        _check_order(version, present[-1] if present else None)
        path = self.path(version)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        cpu = {n: t.detach().to("cpu").contiguous() for n, t in tensors.items()}
        save_file(cpu, str(tmp), metadata={VERSION_KEY: str(version)})
        os.replace(tmp, path)  # atomic: a reader sees the whole file or none
        for old in self.versions()[:-self.keep]:
            self.path(old).unlink(missing_ok=True)

    def fetch(self, version: int, timeout: float) -> dict[str, Tensor]:
        deadline = time.perf_counter() + timeout
        path = self.path(version)
        while not path.exists():
            newer = [v for v in self.versions() if v > version]
            if newer and not path.exists():
                raise WeightVersionError(f"weights of version {version} asked for, but {self.directory} holds versions "
                                         f"{self.versions()}: it was pruned before it was fetched (keep more files)")
            if time.perf_counter() > deadline:
                raise WeightSyncTimeout(f"{path} not published after {timeout:.1f} s (present: {self.versions()})")
            time.sleep(POLL_SECONDS)
        return self._read(path, version)

    def _read(self, path: Path, version: int) -> dict[str, Tensor]:
        from safetensors import safe_open

        error: Exception | None = None
        for attempt in range(self.retries):
            try:
                with safe_open(str(path), framework="pt") as f:
                    stamped = (f.metadata() or {}).get(VERSION_KEY)
                    if stamped != str(version):
                        raise WeightVersionError(f"{path} is stamped version {stamped}, expected {version}")
                    return {name: f.get_tensor(name) for name in f.keys()}
            except WeightVersionError:
                raise
            except Exception as err:  # a file being replaced or damaged: try again, a bounded number of times
                error = err
                time.sleep(POLL_SECONDS * (attempt + 1))
        raise WeightSyncError(f"could not read {path} after {self.retries} tries: {error!r}") from error


def fetch_until(sync: WeightSync, version: int, stop: threading.Event, timeout: float | None,
                poll: float = 0.5) -> dict[str, Tensor] | None:
    """Fetch `version`, waiting for it in slices of `poll` seconds so that `stop` ends the wait
    (-> None); not there after `timeout` seconds (None: no deadline but `stop`, for a sampler
    thread waiting on its own learner) raises `WeightSyncTimeout`."""
    deadline = None if timeout is None else time.perf_counter() + timeout
    while not stop.is_set():
        left = poll if deadline is None else min(poll, max(deadline - time.perf_counter(), 0.0))
        try:
            return sync.fetch(version, left)
        except WeightSyncTimeout:
            if deadline is not None and time.perf_counter() >= deadline:
                raise
    return None
