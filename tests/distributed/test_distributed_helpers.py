"""lit_rlhf.distributed: no-ops in one process; in 2 gloo processes, the moments of the
concatenation of every rank's rows (uneven row counts included)."""

from __future__ import annotations

import json

import pytest
import torch
import torch.multiprocessing as mp

from lit_rlhf import distributed as D
from lit_rlhf.losses import grpo_advantages
from lit_rlhf.ops import masked_mean, masked_var, masked_whiten
from tests.distributed.collectives import global_data, worker
from tests.distributed.launch import free_port


def test_single_process_helpers_equal_the_local_ops():
    values, mask, rewards = global_data()
    assert not D.is_distributed() and D.world_size() == 1 and D.rank() == 0
    torch.testing.assert_close(D.global_masked_whiten(values, mask), masked_whiten(values, mask), rtol=0, atol=1e-12)
    torch.testing.assert_close(
        D.global_masked_whiten(values, mask, shift_mean=False), masked_whiten(values, mask, shift_mean=False), rtol=0, atol=1e-12
    )
    torch.testing.assert_close(D.global_masked_mean(values, mask), masked_mean(values, mask))
    torch.testing.assert_close(D.global_masked_var(values, mask), masked_var(values, mask))
    gathered, own = D.gather_rows(rewards)
    assert torch.equal(gathered, rewards) and own == slice(0, 6)
    with pytest.raises(ValueError, match="at least 2"):
        D.global_masked_var(torch.ones(1, 1), torch.ones(1, 1, dtype=torch.bool))


def test_two_processes_give_the_global_statistics(tmp_path):
    mp.start_processes(worker, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True, start_method="spawn")
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    values, mask, rewards = global_data()
    whole = masked_whiten(values, mask)  # one process seeing every row
    whole_no_shift = masked_whiten(values, mask, shift_mean=False)
    got = torch.tensor(results[0]["whitened"] + results[1]["whitened"], dtype=torch.float64)
    got_no_shift = torch.tensor(results[0]["whitened_no_shift"] + results[1]["whitened_no_shift"], dtype=torch.float64)
    torch.testing.assert_close(got, whole, rtol=0, atol=1e-12)
    torch.testing.assert_close(got_no_shift, whole_no_shift, rtol=0, atol=1e-12)
    # rank-local whitening would be different: the test can tell
    assert not torch.allclose(torch.cat([masked_whiten(values[:3], mask[:3]), masked_whiten(values[3:], mask[3:])]), whole)
    for r in results:
        assert r["world"] == 2
        assert r["mean"] == pytest.approx(float(masked_mean(values, mask)), abs=1e-12)
        assert r["var"] == pytest.approx(float(masked_var(values, mask)), abs=1e-12)
        assert r["gathered"] == rewards.tolist()  # rank order, uneven sizes (4 and 2 rows)
    assert results[0]["own"] == [0, 4] and results[1]["own"] == [4, 6]
    # GRPO `scale: batch` on the gathered rewards, each rank keeping its slice = one process
    full = grpo_advantages(rewards, 2, "batch")
    parts = [grpo_advantages(torch.tensor(r["gathered"], dtype=torch.float64), 2, "batch")[slice(*r["own"])] for r in results]
    torch.testing.assert_close(torch.cat(parts), full)
