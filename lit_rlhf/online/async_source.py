"""Asynchronous rollouts as a rollout source: a producer samples ahead of the learner.

`AsyncRollouts` (the `rollout:` of an online module) runs a producer with its own copy of the
policy (or a vLLM server) that samples the prompt batches ahead of the learner; each training
step takes its batch's responses from a versioned queue instead of sampling them, and everything
after sampling (log-probs, reference, values, rewards, the rollout hooks, the update) is the
synchronous step's. Lightning's fit loop stays in charge: it hands the step its prompt batch as
always, and the source checks that the responses it returns were sampled for those prompts. The
machinery (queue, producer, prompt schedule, samplers) is `lit_rlhf.async_rollouts`.

- **Versions and staleness.** The learner publishes its weights as version k at the start of
  step k (`lit_rlhf.generation.weight_sync`: in memory; a LoRA policy's adapter only); batch k is
  sampled with version max(0, k - max_staleness) (`lit_rlhf.async_rollouts.queue`).
  `max_staleness: 0` is the synchronous run, bitwise; 1 is one-step-off overlap (sampling batch
  k + 1 while the learner trains on batch k).
- **Off-policy correction.** A stale sample's tokens were drawn by older weights. The update's
  "old" log-probs are the learner's current ones (the proximal policy), so its clipped ratio
  starts at 1, and the truncated importance weight `min(pi_current / pi_sampler, tis_cap)`
  (`lit_rlhf.losses.rollout_correction`) corrects for the sampler: the decoupled PPO objective (Hilton et al.
  2022, as AReaL uses it for stale samples) with a truncated behaviour weight. It is on by
  default when `max_staleness` > 0 (`ASYNC_TIS_CAP` unless set; `tis_cap: 0` turns it off), so
  only methods with that correction (`OnlineModule.supports_tis`: GRPO, PPO) take this source.
- **Exact resume.** A checkpoint at step k holds the batches scheduled for weights older than
  version k, which it could not regenerate (`RolloutQueue.checkpoint_batches`: the save waits for
  the producer to finish them); the batches that need version k or newer are sampled again after
  the resume, the same tokens (their random streams are functions of the seed and the batch
  index). The data order is the fit loop's own (`ResumableSampler`). With the `hf` sampler a
  resumed run is the uninterrupted one, bitwise (tested). A vLLM server batches concurrent
  requests as they arrive, and a row's log-probs change in their last bits with its batch-mates:
  with `VLLMServerBackend(concurrency=1)` each request runs alone and a resumed run is bitwise
  the uninterrupted one (tested on CPU).
- **Logs**: `train/async/staleness_mean` and `staleness_max` (versions behind); the sampler's
  log-probs against the learner's (`train/rollout/sampler_logprob_diff`); and, depending on
  timing, `train/perf/queue_depth`, `train/perf/trainer_idle_fraction`, `train/time/rollout_wait`,
  `train/time/rollout_sampling` and `train/time/weight_sync_check` (`lit_rlhf.generation.sync_check`).

A frozen second model (`for_model("reference")`, XPO's) gets a producer and a queue of its own,
with the policy's staleness bound; it never waits for weights, and batch k draws from a generator
seeded from the run's seed, k and the model's name, so its samples never depend on timing and a
resumed run samples again what its checkpoint (the policy's source state, `siblings`) did not hold.

Validation samples with the trainer's own policy (`HFSampler`). Limits: one process (no DDP),
no dynamic sampling, no environments, a second model only on the thread sampler, and a train
loader whose order is a function of (seed, epoch) (`lit_rlhf.async_rollouts.prompts`).
"""

from __future__ import annotations

import copy
import logging
import time
import zlib
from typing import Any, NamedTuple

import torch
from lightning import Callback, Trainer
from torch import Tensor

from lit_rlhf.async_rollouts import (
    GeneratedBatch,
    LocalSampler,
    PromptSchedule,
    RolloutProducer,
    RolloutQueue,
    staleness_stats,
)
from lit_rlhf.generation import SamplingConfig
from lit_rlhf.generation.sync_check import SyncProbe
from lit_rlhf.generation.weight_sync import InMemoryWeightSync, trained_weights
from lit_rlhf.online.server import VLLMServerBackend
from lit_rlhf.online.correction import RolloutCorrection, source_correction
from lit_rlhf.online.sources import HFSampler, Responses, RolloutSource, SampledModel, repeated_prompts, standalone
from lit_rlhf.types import PromptBatch, Rollout

log = logging.getLogger(__name__)

ASYNC_TIS_CAP = 2.0
"""The truncation of the importance weights when `max_staleness` > 0 and `tis_cap` is not set
(C = 2, as in Yao et al. 2025's truncated importance sampling)."""


class Running(NamedTuple):
    """The running parts: the queue, the producer, and the weights it samples with."""

    queue: RolloutQueue
    producer: RolloutProducer
    sync: InMemoryWeightSync
    probe: SyncProbe | None  # the learner stamps each version with it, the sampler checks it


class AsyncRollouts(RolloutSource):
    """Responses sampled ahead of the learner, at most `max_staleness` versions old (see the
    module docstring).

    Args:
        max_staleness: s >= 0: batch k is sampled with the policy of version max(0, k - s), at
            most s + 1 batches in flight; 0 is the synchronous run, bitwise.
        timeout: seconds the learner waits for a batch (and a checkpoint for the batches it holds),
            a vLLM server takes to start, and any one call to it, before it raises.
        tis_cap: the truncated importance weight's cap (the shorthand of `correction: {mode:
            truncate, level: token, upper: tis_cap}`); None = `ASYNC_TIS_CAP` when `max_staleness`
            > 0 and no `correction` is given (off at 0); 0 = off (stale samples trained on
            uncorrected).
        server: sample on a vLLM server in its own process (`VLLMServerBackend`); None = our
            sampler on a copy of the policy in a thread of this process.
        correction: the rollout correction (`lit_rlhf.online.correction.RolloutCorrection`)
            instead of `tis_cap`'s token-level truncation; not both.
    """

    asynchronous = True
    runtime = ("running", "published", "restored")

    def __init__(self, max_staleness: int = 1, timeout: float = 600.0, tis_cap: float | None = None,
                 server: VLLMServerBackend | None = None, correction: RolloutCorrection | None = None) -> None:
        if max_staleness is None or int(max_staleness) < 0:
            raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
        if server is not None and not isinstance(server, VLLMServerBackend):
            raise TypeError(f"server must be a lit_rlhf.online.VLLMServerBackend, got {type(server).__name__}")
        self.max_staleness, self.timeout, self.server = int(max_staleness), float(timeout), server
        # stale samples: the correction on by default
        self.correction = source_correction(tis_cap, correction, ASYNC_TIS_CAP if self.max_staleness > 0 else None)
        self.local = HFSampler()  # validation, and a greedy baseline: the trainer's own policy
        self.running: Running | None = None
        self.published: int | None = None
        self.restored: dict[str, Any] | None = None
        self.stream = 0  # a second model's: its batches' generators are seeded apart from the policy's

    def describe(self) -> str:
        where = "a vLLM server" if self.server is not None else "a thread"
        return f"AsyncRollouts(max_staleness={self.max_staleness}, {where})"

    def problems(self, trainer: Trainer | None, method: type, resamples: bool = False) -> list[str]:
        problems = []
        if self.max_staleness > 0 and not method.supports_tis:
            problems.append(f"AsyncRollouts: stale samples are for the methods with an off-policy correction "
                            f"(GRPO, PPO), not {method.__name__}: use max_staleness 0")
        if resamples:
            problems.append("AsyncRollouts: dynamic sampling draws extra prompts inside the step; it is not "
                            "available with asynchronous rollouts")
        if trainer is not None and trainer.world_size > 1:
            problems.append(f"AsyncRollouts: asynchronous rollouts run on one process, the trainer has "
                            f"{trainer.world_size}")
        return problems

    def sibling(self, name: str) -> "AsyncRollouts":
        """A producer of its own for the frozen model `name` (module docstring), seeded apart."""
        if self.server is not None:
            raise ValueError(f"AsyncRollouts samples a second model ({name}) on the thread sampler only, not on "
                             "a vLLM server: drop `server` or sample synchronously (VLLMSampler)")
        twin = AsyncRollouts(self.max_staleness, self.timeout, tis_cap=0)
        twin.stream = zlib.crc32(name.encode()) << 31
        return twin

    def generate(self, model: SampledModel, prompt_ids: Tensor, prompt_mask: Tensor,
                 sampling: SamplingConfig) -> Responses:
        return self.local.generate(model, prompt_ids, prompt_mask, sampling)

    def sample(self, model: SampledModel, batch: PromptBatch, repeats: int, sampling: SamplingConfig,
               training: bool = True) -> tuple[Rollout, dict[str, Tensor]]:
        if not training:
            return self.local.sample(model, batch, repeats, sampling, training)
        generated, stats = self.take(model, batch)
        prompt_ids, prompt_mask, meta = repeated_prompts(batch, repeats)
        rollout = Rollout(prompt_ids, prompt_mask, generated.response_ids, generated.response_mask, generated.has_eos,
                          None, meta=meta, sampler_logps=generated.sampler_logps)
        return rollout, stats

    # ------------------------------------------------------------------------------------------
    # start and stop
    # ------------------------------------------------------------------------------------------

    def start(self, model: SampledModel, trainer: Trainer, sampling: SamplingConfig, repeats: int) -> None:
        """Build the queue (with a checkpoint's batches), the sampler's copy of `model` and the
        producer, and start it (from `on_train_start`, after the random states are restored)."""
        self.stop(siblings=False)
        s, k = self.max_staleness, int(model.version)
        restored, self.restored = self.restored, None
        if restored is not None and int(restored["max_staleness"]) != s:
            raise ValueError(f"the checkpoint was written by an asynchronous run with max_staleness "
                             f"{restored['max_staleness']}; resume it with the same max_staleness (got {s})")
        batches = [GeneratedBatch.from_state(b) for b in (restored or {}).get("batches") or []]
        min_version = 0
        if k > 0 and restored is None and not model.frozen:
            min_version = k
            log.warning("resuming an asynchronous run from a checkpoint without its rollout queue (a synchronous "
                        "run's): the first batches are sampled with the checkpoint's weights (staleness below %d)", s)
        queue = RolloutQueue(s, next_index=k, min_version=min_version)
        queue.restore(batches)
        schedule = PromptSchedule(trainer.train_dataloader, trainer.num_training_batches)
        sync = InMemoryWeightSync()
        eos, pad = model.tokenizer.eos_token_id, model.tokenizer.pad_token_id
        probe = None if model.frozen else SyncProbe(len(model.tokenizer))
        if self.server is not None:
            sampler = self.server.sampler(model, trainer, sampling, repeats, sync, s, self.timeout, probe)
        else:
            sampler = LocalSampler(copy.deepcopy(standalone(model.model)), sync, sampling, repeats, eos, pad, s,
                                   frozen=model.frozen, stream=self.stream, probe=probe)
        self.running = Running(queue, RolloutProducer(queue, schedule, sampler).start(), sync, probe)
        self.published = None

    def stop(self, siblings: bool = True) -> None:
        for source in (self, *(self.__dict__.get("siblings", {}).values() if siblings else ())):
            running, source.running = source.running, None
            if running is not None:
                running.producer.stop()

    # ------------------------------------------------------------------------------------------
    # the training step's hand-off
    # ------------------------------------------------------------------------------------------

    def take(self, model: SampledModel, batch: PromptBatch) -> tuple[GeneratedBatch, dict[str, Tensor]]:
        """Publish `model`'s current weights (version = rollouts trained on; a frozen model has none
        to publish), then take this step's batch from the queue and check it was sampled for
        `batch`'s prompts -> (batch, stats)."""
        if self.running is None:
            raise RuntimeError("asynchronous rollouts are not running: they start in on_train_start")
        queue, sync, probe = self.running.queue, self.running.sync, self.running.probe
        k, stamped = int(model.version), time.perf_counter()
        if not model.frozen and (self.published is None or self.published < k):
            tensors = trained_weights(model.model)
            sync.publish(k, tensors if probe is None else probe.stamp(tensors, model.model))
            self.published = k
        stamped = time.perf_counter() - stamped
        generated, depth, waited = queue.take(k, self.timeout)
        ids, mask = batch.input_ids, batch.attention_mask.bool()
        same = generated.prompt_ids.shape == ids.shape and torch.equal(generated.prompt_ids.to(ids.device), ids) \
            and torch.equal(generated.prompt_mask.to(ids.device), mask)
        if not same:
            raise RuntimeError(f"rollout {k}: the fit loop's prompt batch is not the one the producer sampled for "
                               "it; the train loader's order must be a function of (seed, epoch) and the fit loop "
                               "must take every batch of an epoch (lit_rlhf.async_rollouts.prompts)")
        stats = staleness_stats(generated, k)
        # what depends on timing goes with the other wall-clock metrics (`time/`, `perf/`)
        stats.update({"perf/queue_depth": torch.tensor(float(depth)), "time/rollout_wait": torch.tensor(waited),
                      "time/rollout_sampling": torch.tensor(generated.seconds)})
        if probe is not None:  # the learner's probe log-probs and the sampler's last check
            stats["time/weight_sync_check"] = torch.tensor(stamped + probe.seconds)
        return generated, stats

    # ------------------------------------------------------------------------------------------
    # checkpoints
    # ------------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any] | None:
        """What a checkpoint holds of the queue: the loaded checkpoint's when the producer never
        started (a resumed run whose budget was already met), None when it has stopped."""
        if self.running is None:
            return self.restored
        if not self.running.producer.running:
            return None
        queue = self.running.queue
        batches = queue.checkpoint_batches(self.timeout)
        state = {"max_staleness": self.max_staleness, "next_index": queue.next_index,
                 "batches": [b.state() for b in batches]}
        siblings = self.__dict__.get("siblings", {})
        return {**state, "siblings": {n: s.state_dict() for n, s in siblings.items()}} if siblings else state

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        self.restored = state
        for name, sibling in self.__dict__.get("siblings", {}).items():
            sibling.load_state_dict(((state or {}).get("siblings") or {}).get(name))


class SourceGuard(Callback):
    """Stops an online module's rollout source when the fit ends on an exception or tears down
    (Lightning calls no module hook on an exception)."""

    def on_exception(self, trainer, pl_module, exception) -> None:
        source = getattr(pl_module, "rollout_source", None)
        if source is not None:
            source.stop()

    def teardown(self, trainer, pl_module, stage) -> None:
        self.on_exception(trainer, pl_module, None)
