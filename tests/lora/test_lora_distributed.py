"""LoRA under DDP and DeepSpeed ZeRO-2/3, 2 CPU processes (DESIGN.md section 3).

DPO (policy adapter, reference = the base with it disabled) and PPO (policy and value adapters
on one base, a trained value head) train with gradients reduced across ranks: every rank ends
with the same adapters. Under ZeRO-3 the ranks generate responses of different lengths
(`synced_gpus`), and DPO's ZeRO-3 checkpoint directory resumes to the weights of a straight run.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.distributed.checks import check_method_results
from tests.distributed.launch import launch

SCRIPT = Path(__file__).resolve().parents[1] / "distributed" / "run_methods.py"
METHODS = ("dpo", "ppo")
STRATEGY = {"ddp": "DDPStrategy", "zero2": "CPUDeepSpeedStrategy", "zero3": "CPUDeepSpeedStrategy"}


@pytest.mark.slow
@pytest.mark.parametrize("strategy", list(STRATEGY))
def test_lora_trains_under_data_parallel_strategies(strategy, tmp_path):
    args = ["--strategy", strategy, "--methods", ",".join(METHODS), "--lora"]
    if strategy == "zero3":
        args += ["--uneven_lengths", "--checkpoint", "dpo"]
    results = launch(SCRIPT, args, 2, tmp_path, timeout=500)
    check_method_results(results, METHODS, STRATEGY[strategy])
    if strategy == "zero3":
        for rank in (0, 1):
            resume = results[rank]["dpo"]["resume"]
            assert resume["is_dir"] and resume["global_step"] == 3
            assert resume["after"] == pytest.approx(resume["straight_after"], rel=1e-9, abs=1e-9)
            assert results[rank]["ppo"]["synced"] == [True]
