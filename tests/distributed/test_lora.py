"""LoRA under DDP and DeepSpeed ZeRO-2/3, 2 CPU processes (`docs/ARCHITECTURE.md` section 4).

DPO (policy adapter, reference = the base with it disabled) and PPO (policy and value adapters
on one base, a trained value head) train with gradients reduced across ranks: every rank ends
with the same adapters. Under DDP the same launch also fits DRO-V (policy and value adapters on
one base, each its own learning rate) and the reward model (a reward adapter and its head). Under
ZeRO-3 the ranks generate responses of different lengths (`synced_gpus`), and DPO's ZeRO-3
checkpoint directory resumes to the weights of a straight run.

The LoRA jobs (`dpo:lora`, ...) run in each strategy's one launch (conftest.py's `ddp_run`,
`zero2_run`, `zero3_run`), after the plain jobs of test_ddp.py, test_zero2.py and test_zero3.py.
"""

from __future__ import annotations

import math

import pytest

from tests.distributed.checks import check_method_results
from tests.distributed.conftest import lora_jobs

STRATEGY = {"ddp": "DDPStrategy", "zero2": "CPUDeepSpeedStrategy", "zero3": "CPUDeepSpeedStrategy"}


@pytest.mark.slow
@pytest.mark.parametrize("strategy", list(STRATEGY))
def test_lora_trains_under_data_parallel_strategies(strategy, request):
    results = request.getfixturevalue(f"{strategy}_run")
    jobs = lora_jobs(strategy)
    check_method_results(results, jobs, STRATEGY[strategy])
    if strategy == "ddp":  # DRO-V's value adapter trained next to the policy adapter, on every rank
        for rank in (0, 1):
            steps = results[rank]["drov:lora"]["metrics"]
            assert all(math.isfinite(step["train/value/loss"]) for step in steps), (rank, steps)
    if strategy == "zero3":
        for rank in (0, 1):
            resume = results[rank]["dpo:lora"]["resume"]
            assert resume["is_dir"] and resume["global_step"] == 3
            assert resume["after"] == pytest.approx(resume["straight_after"], rel=1e-9, abs=1e-9)
            assert results[rank]["ppo:lora"]["synced"] == [True]
