"""Asynchronous rollouts: a producer samples prompt batches ahead of the learner into a bounded,
versioned queue that the online methods' training step (inside Lightning's fit loop) consumes.

- `queue`: every batch stamped with the policy version that sampled it; the admission rule that
  keeps every consumed sample at most `max_staleness` versions old; what a checkpoint holds.
- `prompts`: the prompt batch of every rollout index, computed ahead of the fit loop.
- `producer`: the background producer and the samplers it drives, with their own weights.

The online modules' side (settings, the training step's hand-off, logs, checkpoints) is
`lit_rlhf.online.async_source.AsyncRollouts`; weight sync is `lit_rlhf.generation.weight_sync`.
"""

from lit_rlhf.async_rollouts.prompts import PromptSchedule
from lit_rlhf.async_rollouts.producer import LocalSampler, RolloutProducer, Sampler, rollout_seed
from lit_rlhf.async_rollouts.queue import (
    AdmissionError, GeneratedBatch, ProducerFailed, RolloutQueue, RolloutTimeout, sampling_version, staleness_stats
)

__all__ = [
    "AdmissionError", "GeneratedBatch", "LocalSampler", "ProducerFailed", "PromptSchedule", "RolloutProducer",
    "RolloutQueue", "RolloutTimeout", "Sampler", "rollout_seed", "sampling_version", "staleness_stats"
]
