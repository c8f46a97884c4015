"""Worker of test_distributed_helpers: the helpers in 2 gloo processes (torch.multiprocessing)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.distributed as dist


def global_data():
    """Every rank's rows: uneven sizes (3 and 2 rows), a ragged mask."""
    g = torch.Generator().manual_seed(0)
    values = torch.randn(5, 4, generator=g, dtype=torch.float64)
    mask = torch.rand(5, 4, generator=g) > 0.3
    mask[:, 0] = True
    rewards = torch.tensor([0.1, 0.9, 0.3, 0.3, 2.0, 0.5], dtype=torch.float64)  # 3 groups of G=2
    return values, mask, rewards


def worker(rank: int, world: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from lit_rlhf import distributed as D

    values, mask, rewards = global_data()
    rows = slice(0, 3) if rank == 0 else slice(3, 5)
    groups = slice(0, 4) if rank == 0 else slice(4, 6)  # rank 0: 2 groups, rank 1: 1 group
    gathered, own = D.gather_rows(rewards[groups])
    result = {
        "world": D.world_size(), "rank": D.rank(),
        "whitened": D.global_masked_whiten(values[rows], mask[rows]).tolist(),
        "whitened_no_shift": D.global_masked_whiten(values[rows], mask[rows], shift_mean=False).tolist(),
        "mean": float(D.global_masked_mean(values[rows], mask[rows])),
        "var": float(D.global_masked_var(values[rows], mask[rows])),
        "gathered": gathered.tolist(), "own": [own.start, own.stop],
    }
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    from tests.distributed.workloads import shutdown

    shutdown()  # leave together, without the interpreter's finalisation (see there)
