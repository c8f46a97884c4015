"""DDP with 2 CPU processes (gloo) for every method: SFT (packed rows), Reward, DPO, KTO, DRO-V, PPO, GRPO.

One subprocess run (tests/distributed/run_methods.py, launched as torchrun would, with a hard
timeout) fits each method for 1-2 optimizer steps on the tiny model; here we check every rank's
results. Measured: ~40 s on 2 shared cores, almost all of it process start-up and imports.
"""

from __future__ import annotations

from pathlib import Path

from tests.distributed.checks import check_method_results
from tests.distributed.launch import launch
from tests.distributed.workloads import METHODS

SCRIPT = Path(__file__).with_name("run_methods.py")


def test_every_method_trains_under_ddp_with_two_processes(tmp_path):
    results = launch(SCRIPT, ["--strategy", "ddp", "--methods", ",".join(METHODS)], 2, tmp_path, timeout=300)
    check_method_results(results, METHODS, "DDPStrategy")
    assert [r["sft"]["attention"] for r in results] == ["sdpa_varlen"] * 2  # packed SFT rows, one example at a time
    for method in ("ppo", "grpo"):  # replicated weights: no synced generation needed
        assert results[0][method]["synced"] == [False] and results[1][method]["synced"] == [False]
