"""The versioned rollout queue: the schedule, admission control, hand-off deadlines, errors and
what a checkpoint holds; the prompt schedule against the fit loop's order. No model."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

from lit_rlhf.async_rollouts import (
    AdmissionError,
    GeneratedBatch,
    ProducerFailed,
    PromptSchedule,
    RolloutQueue,
    RolloutTimeout,
    sampling_version,
)


def batch(index: int, version: int, rows: int = 2) -> GeneratedBatch:
    ids = torch.full((rows, 3), index)
    return GeneratedBatch(index, version, ids, torch.ones(rows, 3, dtype=torch.bool), ids, torch.ones(rows, 3, dtype=torch.bool),
                          torch.ones(rows, dtype=torch.bool), torch.zeros(rows, 3), torch.full((rows,), version))


def test_schedule_lags_by_max_staleness_and_admits_at_most_s_plus_one_batches():
    assert [sampling_version(k, 0) for k in range(4)] == [0, 1, 2, 3]
    assert [sampling_version(k, 2) for k in range(5)] == [0, 0, 0, 1, 2]
    q = RolloutQueue(max_staleness=2)
    assert [k for k in range(6) if q.admits(k)] == [0, 1, 2]  # (s + 1) batches in flight at most
    for k in range(3):
        q.put(batch(k, 0))
    with pytest.raises(AdmissionError, match="beyond the staleness bound"):
        q.put(batch(3, 1))
    got, depth, _ = q.take(0, timeout=1)
    assert got.index == 0 and depth == 3
    q.put(batch(3, 1))  # admitted once batch 0 is consumed
    # every consumed sample is at most s versions old: batch k is consumed at learner version k
    for k in (1, 2, 3):
        got, _, _ = q.take(k, timeout=1)
        assert 0 <= k - got.version <= 2


def test_batches_come_in_order_with_their_scheduled_version():
    q = RolloutQueue(max_staleness=1)
    with pytest.raises(AdmissionError, match="batch 0 expected"):
        q.put(batch(1, 0))
    with pytest.raises(AdmissionError, match="sampled with version 1, its schedule says 0"):
        q.put(batch(0, 1))
    q.put(batch(0, 0))
    with pytest.raises(AdmissionError, match="batch 1 expected"):
        q.put(batch(0, 0))  # no batch twice
    with pytest.raises(AdmissionError, match="asked for batch 1"):
        q.take(1, timeout=1)


def test_take_times_out_naming_the_producer_state_and_raises_the_producer_error():
    q = RolloutQueue(max_staleness=0)
    q.producer_state = "sampling batch 0 with version 0"
    started = time.perf_counter()
    with pytest.raises(RolloutTimeout, match="sampling batch 0 with version 0"):
        q.take(0, timeout=0.2)
    assert time.perf_counter() - started < 2
    threading.Timer(0.05, q.fail, args=(ValueError("engine died"),)).start()
    with pytest.raises(ProducerFailed, match="engine died"):
        q.take(0, timeout=10)


def test_a_checkpoint_holds_the_batches_of_older_weights_and_waits_for_them():
    q = RolloutQueue(max_staleness=2)
    for k in range(3):
        q.put(batch(k, 0))
    q.take(0, timeout=1)
    q.take(1, timeout=1)  # learner at version 2: batch 3 (version 1) is owed, batch 4 (version 2) is not
    threading.Timer(0.1, q.put, args=(batch(3, 1),)).start()
    held = q.checkpoint_batches(timeout=5)
    assert [b.index for b in held] == [2, 3]
    restored = RolloutQueue(max_staleness=2, next_index=2)
    restored.restore([GeneratedBatch.from_state(b.state()) for b in held])
    assert restored.next_to_put() == 4 and restored.version_of(4) == 2
    # a run resumed without the owed batches (a synchronous run's checkpoint) samples them with its weights
    assert RolloutQueue(max_staleness=2, next_index=2, min_version=2).version_of(3) == 2
    with pytest.raises(RolloutTimeout, match="not all sampled"):
        RolloutQueue(max_staleness=1, next_index=1).checkpoint_batches(timeout=0.1)


def test_prompt_schedule_is_the_fit_loops_order_across_epochs():
    rows = list(range(7))
    sampler = DistributedSampler(rows, num_replicas=1, rank=0, shuffle=True, seed=3)
    loader = DataLoader(rows, batch_size=3, sampler=sampler)  # 3 batches per epoch, the last one short
    schedule = PromptSchedule(loader, batches_per_epoch=len(loader))
    expected = []
    for epoch in range(3):  # what Lightning's fit loop iterates
        sampler.set_epoch(epoch)
        expected += [b.tolist() for b in loader]
    assert [schedule.batch(k).tolist() for k in range(9)] == expected
    with pytest.raises(ValueError, match="no set_epoch"):
        PromptSchedule(DataLoader(rows, batch_size=3, shuffle=True), 3)
