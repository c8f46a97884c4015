"""The producer: samples prompt batches ahead of the learner into the `RolloutQueue`.

`RolloutProducer` runs in a background thread of the learner's process. For each batch index k,
in order, it waits until the queue admits k (at most `max_staleness + 1` batches ahead of the
learner), brings its sampler to the scheduled version (`queue.sampling_version`), builds prompt
batch k (`PromptSchedule`) and hands the sampled batch to the queue. An error stops it and is
raised in the learner at its next `take`; `stop` ends it at its next wait.

A `Sampler` owns its copy of the policy's weights and keeps it at a version through a
`lit_rlhf.generation.weight_sync.WeightSync`:

- `LocalSampler`: our KV-cache sampler (`generation_backend: hf`) on a copy of the policy in the
  producer thread, synced in memory (for a LoRA policy: the adapter only).

**Randomness.** With `max_staleness: 0` the learner waits while its batch is sampled, so the
sampler draws from torch's global generator exactly where the synchronous run draws: the same
tokens, bitwise. With `max_staleness` > 0 sampling overlaps the learner's update, which draws
from the global generator too (minibatch shuffles), so each batch k draws from its own generator
seeded from the run's seed and k (`rollout_seed`). Either way batch k is a function of the
run's seed, its prompts and the weights of its scheduled version: a resumed run samples again,
token for token, whatever the checkpoint did not hold.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from abc import ABC, abstractmethod
from typing import Any

import torch
from torch import Tensor, nn

from lit_rlhf.async_rollouts.prompts import PromptSchedule
from lit_rlhf.async_rollouts.queue import GeneratedBatch, RolloutQueue, stack_versions
from lit_rlhf.generation import SamplingConfig, generate_responses
from lit_rlhf.generation.sync_check import SyncCheckError
from lit_rlhf.generation.weight_sync import PROBE_KEY, WeightSync, fetch_until, load_weights

log = logging.getLogger(__name__)


def rollout_seed(index: int, seed: int | None = None) -> int:
    """The seed of batch `index`'s own generator, from the run's seed (`PL_GLOBAL_SEED`, set by
    `seed_everything`, unless given)."""
    seed = int(os.environ.get("PL_GLOBAL_SEED", 0)) if seed is None else seed
    return (seed * 1_000_003 + index * 7_919 + 17) % (2**63)


class Sampler(ABC):
    """Samples one prompt batch with the weights of a given policy version, which it takes from
    `sync`, where the learner publishes them (in this process: the wait for one ends when it is
    published or when the producer is stopped; the learner's own waits have deadlines).

    With a `probe` (`sync_check.SyncProbe`), a version the learner stamped with its probe
    log-probs is checked once loaded (`check`): `SyncCheckError` naming the sync, the version and
    the worst token, or with `probe.retry` the version is loaded again once first."""

    version: int | None = None  # the version of the weights it holds (None: not known)
    probe: Any = None
    frozen = False  # the weights never change (a reference): every version is the one it holds
    stream = 0  # nonzero: a generator per batch, seeded `rollout_seed(index) ^ stream`

    def prepare(self, version: int, stop: threading.Event) -> bool:
        """Bring the sampler's weights to `version`; False when `stop` ended the wait."""
        if version == self.version or self.frozen:
            self.version = version
            return True
        tensors = fetch_until(self.sync, version, stop, timeout=None)
        if tensors is None:
            return False
        tensors = dict(tensors)
        expected = tensors.pop(PROBE_KEY, None)
        for again in (False, True):
            self.load(version, tensors)
            if self.probe is None or expected is None:
                break
            try:
                self.check(version, expected)
                break
            except SyncCheckError as err:
                if again or not self.probe.retry:
                    raise
                log.warning("%s; sending version %d again", err, version)
        self.version = version
        return True

    @abstractmethod
    def load(self, version: int, tensors: dict[str, Tensor]) -> None:
        """Make the published weights of `version` the ones the sampler samples with."""

    @abstractmethod
    def check(self, version: int, expected: Tensor) -> None:
        """Score the probe with the loaded weights against the trainer's `expected` log-probs."""

    @abstractmethod
    def sample(self, index: int, version: int, prompts: Any) -> GeneratedBatch:
        """Sample batch `index` (its `prompts`, a PromptBatch) with the weights of `version`."""

    def rows(self, index: int, version: int, prompts: Any, device: Any = None):
        """-> prompt ids and mask (B, P), their `repeats` copies (B*G, P, a prompt's copies
        contiguous) and the batch's generator: None (torch's global one) with `max_staleness: 0`
        and no `stream`, else its own (module docstring)."""
        if version != self.version:
            raise RuntimeError(f"batch {index} is scheduled for version {version}, the sampler holds {self.version}")
        prompt_ids, prompt_mask = prompts.input_ids.to(device), prompts.attention_mask.to(device).bool()
        generator = None
        if self.max_staleness > 0 or self.stream:
            generator = torch.Generator(device=device or "cpu")
            generator.manual_seed(rollout_seed(index) ^ self.stream)
        return (prompt_ids, prompt_mask, prompt_ids.repeat_interleave(self.repeats, dim=0),
                prompt_mask.repeat_interleave(self.repeats, dim=0), generator)

    def close(self) -> None:
        """Release the sampler's resources."""
        self.sync.close()


class LocalSampler(Sampler):
    """Our KV-cache sampler on `model`, a copy of the policy (with LoRA: of the whole adapter
    model), kept at a version through `sync` (in-process).

    Args:
        model: the sampler's copy of the policy (it is put in eval mode).
        sync: where the learner publishes its versions.
        sampling: how responses are drawn; `repeats` responses per prompt.
        eos_token_id, pad_token_id: the tokenizer's (D3, D23).
        max_staleness: 0 draws from torch's global generator, > 0 from a generator per batch.
        frozen: `model`'s weights never change (a reference): every version is the one it holds.
        stream: nonzero: always a generator per batch, seeded `rollout_seed(index) ^ stream` (a
            second model's samples, independent of the policy's and of timing).
        probe: the learner's `SyncProbe` (`Sampler`; None: versions not checked).
    """

    def __init__(self, model: nn.Module, sync: WeightSync, sampling: SamplingConfig, repeats: int,
                 eos_token_id: int, pad_token_id: int, max_staleness: int, frozen: bool = False,
                 stream: int = 0, probe: Any = None) -> None:
        self.model = model.eval().requires_grad_(False)
        self.sync, self.sampling, self.repeats = sync, sampling, repeats
        self.eos_token_id, self.pad_token_id = eos_token_id, pad_token_id
        self.max_staleness, self.frozen, self.stream, self.probe = max_staleness, frozen, stream, probe
        self.version = None

    def load(self, version: int, tensors: dict[str, Tensor]) -> None:
        load_weights(self.model, tensors)

    def check(self, version: int, expected: Tensor) -> None:
        self.probe.verify_model("in-memory sync (asynchronous producer)", version, self.model, expected)

    @torch.no_grad()
    def sample(self, index: int, version: int, prompts: Any) -> GeneratedBatch:
        device = next(self.model.parameters()).device
        prompt_ids, prompt_mask, ids, mask, generator = self.rows(index, version, prompts, device)
        response_ids, response_mask, has_eos, logps = generate_responses(
            self.model, ids, mask, self.sampling, self.eos_token_id, self.pad_token_id, generator=generator,
            return_logps=True)
        return GeneratedBatch(index, version, prompt_ids, prompt_mask, response_ids, response_mask, has_eos, logps,
                              stack_versions(version, ids.shape[0]).to(device))


class RolloutProducer:
    """Samples batches `queue.next_to_put()`, ... into `queue` in a daemon thread (module docstring)."""

    def __init__(self, queue: RolloutQueue, schedule: PromptSchedule, sampler: Sampler) -> None:
        self.queue, self.schedule, self.sampler = queue, schedule, sampler
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.sampled = 0  # batches sampled by this producer

    def start(self) -> "RolloutProducer":
        self._thread = threading.Thread(target=self._run, name="lit_rlhf-rollout-producer", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        queue = self.queue
        index = queue.next_to_put()
        try:
            while not self._stop.is_set():
                if not queue.wait_admitted(index, self._stop):
                    break
                version = queue.version_of(index)
                queue.producer_state = f"waiting for the weights of version {version} (batch {index})"
                if not self.sampler.prepare(version, self._stop):
                    break
                prompts = self.schedule.batch(index)
                queue.producer_state = f"sampling batch {index} with version {version}"
                started = time.perf_counter()
                batch = self.sampler.sample(index, version, prompts)
                batch.seconds = time.perf_counter() - started
                queue.put(batch)
                self.sampled += 1
                index += 1
            queue.producer_state = f"stopped before batch {index}"
        except BaseException as err:  # noqa: BLE001 - handed to the learner, which raises it
            queue.producer_state = f"failed at batch {index}"
            log.error("the rollout producer failed at batch %d: %r", index, err)
            queue.fail(err)

    def stop(self, timeout: float = 60.0) -> None:
        """Stop at the next wait and join the thread (at most `timeout` seconds: a batch being
        sampled finishes first); then release the sampler."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
            if thread.is_alive():
                log.warning("the rollout producer did not stop within %.0f s (still %s); it is a daemon thread and "
                            "ends with the process", timeout, self.queue.producer_state)
        self.sampler.close()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()
