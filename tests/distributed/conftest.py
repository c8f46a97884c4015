"""One 2-process launch of `run_methods.py` per strategy, shared by every test of that strategy.

Starting a launch (two interpreters importing torch, Lightning and transformers, a process
group, DeepSpeed) costs more on a 2-core CPU than the tiny fits it runs, so each strategy's jobs
(plain, LoRA, `frozen_placement: whole`, shared-prompt probes) run in one launch, on first use,
and each test checks its part of the results. A failed launch fails every test that uses it,
with each rank's output tail.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.distributed.launch import launch

SCRIPT = Path(__file__).with_name("run_methods.py")
METHODS = ("sft", "reward", "dpo", "kto", "drov", "ppo", "grpo")
LORA = {"ddp": ("dpo", "ppo", "drov", "reward"), "zero2": ("dpo", "ppo"), "zero3": ("dpo", "ppo")}
DEEPSPEED_METHODS = ("dpo", "ppo", "grpo")


def lora_jobs(strategy: str) -> tuple[str, ...]:
    return tuple(f"{method}:lora" for method in LORA[strategy])


def _run(strategy: str, tmp_path_factory, jobs: tuple[str, ...], *extra: str, timeout: float) -> list[dict]:
    out = tmp_path_factory.mktemp(strategy)
    return launch(SCRIPT, ["--strategy", strategy, "--methods", ",".join(jobs), *extra], 2, out, timeout=timeout)


@pytest.fixture(scope="session")
def ddp_run(tmp_path_factory) -> list[dict]:
    """Every method, then LoRA on DPO, PPO, DRO-V and the reward model."""
    return _run("ddp", tmp_path_factory, METHODS + lora_jobs("ddp"), timeout=600)


@pytest.fixture(scope="session")
def zero2_run(tmp_path_factory) -> list[dict]:
    """DPO, PPO, GRPO, then LoRA on DPO and PPO."""
    return _run("zero2", tmp_path_factory, DEEPSPEED_METHODS + lora_jobs("zero2"), timeout=700)


@pytest.fixture(scope="session")
def zero3_run(tmp_path_factory) -> list[dict]:
    """DPO, PPO, GRPO with uneven generation lengths; GRPO with `frozen_placement: whole`; LoRA on
    DPO and PPO; DPO and LoRA-DPO checkpointed and resumed; DPO's gradients probed (chunked,
    dense and shared-prompt log-probs)."""
    jobs = DEEPSPEED_METHODS + ("grpo:whole",) + lora_jobs("zero3")
    return _run("zero3", tmp_path_factory, jobs, "--uneven_lengths", "--checkpoint", "dpo,dpo:lora",
                "--grad_probe", timeout=1200)


FSDP2_JOBS = ("sft", "reward", "dpo", "kto", "drov", "ppo", "grpo", "grpo:whole", "dpo:lora", "reward:lora", "dpo:file",
              "dpo:dense", "sft:ddp", "reward:ddp", "dpo:ddp", "drov:ddp", "ppo:ddp", "grpo:ddp")


@pytest.fixture(scope="session")
def fsdp2_run(tmp_path_factory) -> list[dict]:
    """FSDP2 (ModelParallelStrategy): every method, LoRA DPO and reward model; DPO (sharded and
    consolidated checkpoints) and GRPO stopped, resumed and compared with straight runs; exports,
    weight gathers, gradient clipping; the same fits under DDP (run_fsdp2.py)."""
    out = tmp_path_factory.mktemp("fsdp2")
    script = Path(__file__).with_name("run_fsdp2.py")
    return launch(script, ["--jobs", ",".join(FSDP2_JOBS), "--resume", "dpo,grpo,dpo:file"], 2, out, timeout=600)
