"""The versioned rollout queue: responses sampled ahead of the learner, each stamped with the
policy version that sampled it, and the admission rule that bounds how old they are.

**Versions.** The policy's version is the number of rollouts the learner has trained on: version
v is the weights at the start of the learner's step v (version 0: the initial weights).

**Schedule and admission control.** Batch k (the k-th prompt batch of the fit, counted from 0
over the whole run) is sampled with the weights of version `sampling_version(k, s) = max(0, k - s)`,
s = `max_staleness`, and is admitted (may start) only once those weights exist, i.e. once the
learner's step k - s has begun. The learner trains on batch k at version k, so every sample is
min(k, s) <= s versions old when it is consumed, and at most s + 1 batches ((s + 1) x batch size
samples) are queued or being sampled at any time. This is AReaL's rule (Fu et al. 2025,
staleness-aware asynchronous RL): staleness is bounded by how far the producer may run ahead,
not by dropping the samples that took long, which would bias training towards short responses.

A batch takes the OLDEST version the bound admits, not the newest one available when it starts:
which version is newest at some moment depends on timing, the oldest does not. So an
asynchronous run is a function of its seed and its schedule, bitwise reproducible and resumable
exactly (`RolloutQueue.checkpoint_batches`). With s = 0 the learner waits for each batch, sampled
with its current weights: the synchronous run.

**Hand-off.** The producer `put`s batches in index order; the learner `take`s them in index
order with a deadline. A producer that failed makes the learner's next `take` raise the
producer's error at once; a batch that does not come in time raises `RolloutTimeout` naming what
the producer was doing. Nothing here blocks without a deadline or a stop flag.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import Tensor


def sampling_version(index: int, max_staleness: int) -> int:
    """The policy version batch `index` is sampled with: `max(0, index - max_staleness)`."""
    return max(0, index - max_staleness)


class RolloutTimeout(TimeoutError):
    """The learner waited longer than its deadline for a batch."""


class ProducerFailed(RuntimeError):
    """The producer stopped with an error; raised in the learner with the producer's error as cause."""


class AdmissionError(RuntimeError):
    """A batch was offered out of order or beyond the staleness bound."""


@dataclass
class GeneratedBatch:
    """The responses sampled for one prompt batch (N = B x repeats rows, a prompt's copies contiguous).

    `prompt_ids`/`prompt_mask` are the batch's prompts as the fit loop hands them, (B, P) left
    padded (before the repeats), so the learner can check it trains on the batch that was sampled.
    `versions` (N,) stamps every row with the policy version that sampled it.
    """

    index: int
    version: int
    prompt_ids: Tensor  # (B, P)
    prompt_mask: Tensor  # (B, P) bool
    response_ids: Tensor  # (N, R)
    response_mask: Tensor  # (N, R) bool
    has_eos: Tensor  # (N,) bool
    sampler_logps: Tensor  # (N, R) float32, 0 where the mask is False
    versions: Tensor  # (N,) int64
    seconds: float = 0.0  # sampling wall time

    def state(self) -> dict[str, Any]:
        """Plain tensors and numbers, for a checkpoint (`from_state` reads it back); the wall time
        is a measurement of this run, not state."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "seconds"}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> "GeneratedBatch":
        return cls(**{f.name: state[f.name] for f in fields(cls) if f.name in state})


class RolloutQueue:
    """The bounded, versioned hand-off between one producer and the learner (see the module doc).

    Args:
        max_staleness: s, the most versions a consumed sample may be behind.
        next_index: the batch the learner takes next (0 at the start of a fit; the checkpoint's
            count of rollouts on a resume).
        min_version: no batch is sampled with an older version (`version_of`): a run resumed
            from a checkpoint that holds none of the batches scheduled for older weights (one
            written by a synchronous run) samples them with the checkpoint's.
    """

    def __init__(self, max_staleness: int, next_index: int = 0, min_version: int = 0) -> None:
        if max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
        self.max_staleness = int(max_staleness)
        self.next_index = int(next_index)
        self.min_version = int(min_version)
        self._ready: dict[int, GeneratedBatch] = {}
        self._cond = threading.Condition()
        self._error: BaseException | None = None
        self.producer_state = "not started"  # what the producer is doing, for error messages

    def version_of(self, index: int) -> int:
        """The version batch `index` is sampled with: its schedule's (`sampling_version`), at
        least `min_version`."""
        return max(sampling_version(index, self.max_staleness), self.min_version)

    @property
    def capacity(self) -> int:
        """Batches that may be queued or in flight at once: s + 1."""
        return self.max_staleness + 1

    def admits(self, index: int) -> bool:
        """Whether batch `index` may be in flight now: it is one of the s + 1 batches from the one
        the learner takes next."""
        return self.next_index <= index < self.next_index + self.capacity

    def next_to_put(self) -> int:
        """The index of the batch the producer hands over next."""
        with self._cond:
            return max([self.next_index - 1, *self._ready]) + 1

    def put(self, batch: GeneratedBatch, restored: bool = False) -> None:
        """Hand over a finished batch; it must be admitted, sampled with its scheduled version
        (`version_of`; not checked for a batch `restored` from a checkpoint, sampled under the
        schedule of the run that wrote it), and come in index order."""
        with self._cond:  # reentrant: `next_to_put` takes it too
            expected = self.next_to_put()
            if batch.index != expected:
                raise AdmissionError(f"batch {batch.index} offered, batch {expected} expected next (batches come "
                                     "in order, each once)")
            if not self.admits(batch.index):
                raise AdmissionError(f"batch {batch.index} is beyond the staleness bound: the learner takes batch "
                                     f"{self.next_index} next and at most {self.capacity} (max_staleness + 1) may be "
                                     "in flight")
            want = batch.version if restored else self.version_of(batch.index)
            if batch.version != want or bool((batch.versions != want).any()):
                raise AdmissionError(f"batch {batch.index} was sampled with version {batch.version}, its schedule "
                                     f"says {want} (max_staleness {self.max_staleness})")
            self._ready[batch.index] = batch
            self._cond.notify_all()

    def fail(self, error: BaseException) -> None:
        """The producer stopped with `error`: the learner's next `take` raises it."""
        with self._cond:
            self._error = error
            self._cond.notify_all()

    def wait_admitted(self, index: int, stop: threading.Event, poll: float = 0.05) -> bool:
        """Block until batch `index` is admitted (False when `stop` is set first)."""
        with self._cond:
            while not self.admits(index):
                if stop.is_set():
                    return False
                self._cond.wait(poll)
        return True

    def take(self, index: int, timeout: float) -> tuple[GeneratedBatch, int, float]:
        """Batch `index` (the next one), waiting at most `timeout` seconds -> (batch, queue depth
        when the learner asked, seconds waited)."""
        if index != self.next_index:
            raise AdmissionError(f"the learner asked for batch {index}, the queue's next is {self.next_index}")
        started = time.perf_counter()
        deadline = started + timeout
        with self._cond:
            depth = len(self._ready)
            self._wait_for(lambda: index in self._ready, deadline, f"before batch {index} was ready",
                           f"batch {index} was not ready after {timeout:.0f} s",
                           "; raise async_timeout if sampling one batch takes longer")
            batch = self._ready.pop(index)
            self.next_index = index + 1
            self._cond.notify_all()  # admits the next batch
        return batch, depth, time.perf_counter() - started

    def _wait_for(self, done, deadline: float, failed_before: str, timed_out: str, hint: str = "") -> None:
        """With the lock held: wait until `done()`; a failed producer or the deadline raise."""
        while not done():
            if self._error is not None:
                raise ProducerFailed(f"the rollout producer failed {failed_before} ({self.producer_state}): "
                                     f"{self._error!r}") from self._error
            left = deadline - time.perf_counter()
            if left <= 0:
                raise RolloutTimeout(f"{timed_out} (the producer is {self.producer_state}){hint}")
            self._cond.wait(min(left, 1.0))

    def checkpoint_batches(self, timeout: float) -> list[GeneratedBatch]:
        """The batches a checkpoint must hold: every one scheduled after the learner's position
        whose sampling version is older than the learner's current weights (version
        `next_index`). A checkpoint holds only the current weights, so these cannot be
        regenerated from it; they need only versions that are already published, so this waits
        (at most `timeout` seconds) until the producer has finished them. The batches that use
        the current weights or newer are not saved: a resumed run samples them again, the same
        tokens (`lit_rlhf.async_rollouts.producer`)."""
        want = [i for i in range(self.next_index, self.next_index + self.capacity)
                if self.version_of(i) < self.next_index]
        deadline = time.perf_counter() + timeout
        with self._cond:
            self._wait_for(lambda: all(i in self._ready for i in want), deadline,
                           f"before the checkpoint's batches {want} were ready",
                           f"checkpoint: batches {want} not all sampled after {timeout:.0f} s")
            return [self._ready[i] for i in want]

    def restore(self, batches: list[GeneratedBatch]) -> None:
        """Put a checkpoint's batches back (before the producer starts)."""
        for batch in sorted(batches, key=lambda b: b.index):
            self.put(batch, restored=True)


def staleness_stats(batch: GeneratedBatch, learner_version: int) -> dict[str, Tensor]:
    """`async/staleness_mean` and `async/staleness_max` of a consumed batch (versions behind)."""
    stale = (learner_version - batch.versions).float()
    return {"async/staleness_mean": stale.mean(), "async/staleness_max": stale.max()}


def stack_versions(version: int, rows: int) -> Tensor:
    """(rows,) int64 version stamps."""
    return torch.full((rows,), int(version), dtype=torch.long)
