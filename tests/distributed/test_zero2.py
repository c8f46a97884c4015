"""DeepSpeed ZeRO-2 with 2 CPU processes (gloo, tests/distributed/cpu_deepspeed.py): DPO, PPO, GRPO.

PPO (policy + value model) and its two parameter groups train in ONE DeepSpeed engine; the
online modules hand `max_grad_norm` to the engine (Lightning's clip_gradients is a no-op under
DeepSpeed). The first DeepSpeed run on a machine compiles a small op (~50 s, cached after).
The launch (the `zero2_run` fixture of conftest.py) also runs the LoRA jobs of test_lora.py.
"""

from __future__ import annotations

from tests.distributed.checks import check_method_results
from tests.distributed.conftest import DEEPSPEED_METHODS as METHODS


def test_dpo_ppo_grpo_train_under_deepspeed_zero2(zero2_run):
    results = zero2_run
    check_method_results(results, METHODS, "CPUDeepSpeedStrategy")
    for method in ("ppo", "grpo"):
        for res in (results[0][method], results[1][method]):
            assert res["synced"] == [False]  # ZeRO-2 keeps whole weights on every rank
            assert res["gradient_clipping"] == 1.0  # max_grad_norm reached the engine
    assert results[0]["dpo"]["gradient_clipping"] == 0.0  # offline: trainer.gradient_clip_val (unset)
