"""DDP with 2 CPU processes (gloo) for every method: SFT (packed rows), Reward, DPO, KTO, DRO-V, PPO, GRPO.

One subprocess run (tests/distributed/run_methods.py, launched as torchrun would, with a hard
timeout; the `ddp_run` fixture of conftest.py, which also runs the LoRA jobs of
test_lora.py) fits each method for 1-2 optimizer steps on the tiny model; here we check every
rank's results.
"""

from __future__ import annotations

from tests.distributed.checks import check_method_results
from tests.distributed.conftest import METHODS


def test_every_method_trains_under_ddp_with_two_processes(ddp_run):
    results = ddp_run
    check_method_results(results, METHODS, "DDPStrategy")
    assert [r["sft"]["attention"] for r in results] == ["sdpa_varlen"] * 2  # packed SFT rows, one example at a time
    for method in ("ppo", "grpo"):  # replicated weights: no synced generation needed
        assert results[0][method]["synced"] == [False] and results[1][method]["synced"] == [False]
