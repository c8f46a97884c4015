"""The validation records behind the per-group accuracy tables and the calibration plot (D16, D18)
are synced across processes by torchmetrics.

Two "ranks" are two `PreferenceRecords` with uneven numbers of pairs and labels seen by one rank
only. torchmetrics' own sync path (`compute()` -> `Metric.sync`) runs with a stand-in for the all-gather that
returns the other rank's state, so what is tested is exactly what DDP does minus the transport
(a real 2-process gloo run costs ~70 s of imports on this shared machine).
"""

from __future__ import annotations

import pytest
import torch
from torchmetrics.utilities import dim_zero_cat

from lit_rlhf.training.reward_metrics import PreferenceRecords, grouped_accuracy

RANK_DATA = {
    0: [([1.0, -0.5, 2.0], {"batch": ["batch13", "batch13", "batch18"], "confidence": [3, 9, 3]})],
    1: [([0.25], {"batch": ["batch18"], "confidence": [9]}),
        ([-1.0, 0.75], {"batch": ["batch7", "batch13"], "confidence": [1, 1]})],
}


def _rank(rank: int, **kwargs) -> PreferenceRecords:
    records = PreferenceRecords(("batch", "confidence"), **kwargs)
    for diffs, meta in RANK_DATA[rank]:
        records.update(torch.tensor(diffs), meta)
    return records


def _synced(rank: int):
    other = _rank(1 - rank)
    # the other rank's states, in the order torchmetrics gathers them (registration order)
    other_states = iter([dim_zero_cat(getattr(other, name)) for name in other._reductions])

    def all_gather(tensor, group=None):
        theirs = next(other_states)
        return [tensor, theirs] if rank == 0 else [theirs, tensor]

    me = _rank(rank, dist_sync_fn=all_gather, distributed_available_fn=lambda: True)
    return me.compute()  # compute() syncs, as under DDP


def test_records_are_gathered_from_every_process():
    results = []
    for rank in (0, 1):
        diffs, groups = _synced(rank)
        results.append((diffs.tolist(), grouped_accuracy(diffs > 0, groups["batch"]),
                        grouped_accuracy(diffs > 0, groups["confidence"])))
    assert results[0] == results[1]  # every rank logs the same table
    diffs, by_batch, by_conf = results[0]
    assert diffs == [1.0, -0.5, 2.0, 0.25, -1.0, 0.75]
    assert by_batch == [("batch13", pytest.approx(2 / 3), 3), ("batch18", 1.0, 2), ("batch7", 0.0, 1)]
    assert by_conf == [("1", 0.5, 2), ("3", 1.0, 2), ("9", 0.5, 2)]


def test_unsynced_rank_sees_only_its_own_pairs():
    diffs, groups = _rank(1).compute()
    assert diffs.tolist() == [0.25, -1.0, 0.75]
    assert sorted(set(groups["batch"])) == ["batch13", "batch18", "batch7"]
