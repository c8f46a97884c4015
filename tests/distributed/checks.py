"""Assertions shared by the multi-process tests on the JSON results of run_methods.py."""

from __future__ import annotations

import math

import pytest

LOSS_KEY = {"ppo": "train/loss/total", "grpo": "train/loss/total"}
# optimizer steps of one run_methods fit: 2 for offline methods; PPO: 1 epoch x 2 minibatches;
# GRPO: 1 iteration x 1 minibatch
EXPECTED_STEPS = {"ppo": 2, "grpo": 1}


def check_method_results(results: list[dict], jobs: tuple[str, ...], strategy_name: str) -> None:
    """`jobs`: run_methods.py's job names, `method[:option]` (e.g. `dpo:lora`)."""
    for job in jobs:
        method = job.partition(":")[0]
        per_rank = [r[job] for r in results]
        for rank, res in enumerate(per_rank):
            where = f"{job} rank {rank}"
            assert res["strategy"] == strategy_name, where
            assert res["global_step"] == EXPECTED_STEPS.get(method, 2), where
            losses = [step[LOSS_KEY.get(method, "train/loss")] for step in res["metrics"]]
            assert losses and all(math.isfinite(x) for x in losses), (where, losses)
        # the weights moved, and every rank holds the same weights: the gradients were reduced
        assert per_rank[0]["after"] != pytest.approx(per_rank[0]["before"], rel=1e-7, abs=0), job
        assert per_rank[0]["after"] == pytest.approx(per_rank[1]["after"], rel=1e-12, abs=1e-9), job
        if method in ("ppo", "grpo"):
            assert all(len(r["lengths"]) == 1 for r in per_rank), job  # one rollout per rank
        else:  # the ranks trained on different rows
            assert per_rank[0]["metrics"][0]["prompts"] != per_rank[1]["metrics"][0]["prompts"]
