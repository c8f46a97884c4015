"""Smoke test of benchmarks/bench_memory*.py: the SFT worker runs one measured step with gradient
checkpointing on the tiny model (in process, ours only); the by-phase arithmetic."""

from __future__ import annotations

import pytest

from benchmarks import bench_memory, bench_memory_sft

SMALL = ["--model", "tiny-random-llama", "--warmup", "1", "--steps", "1", "--rounds", "1", "--frameworks", "ours",
         "--in-process", "--batch-size", "1", "--prompt-length", "12", "--completion-length", "6"]


def test_sft_memory_worker_runs_with_gradient_checkpointing(tmp_path):
    result = bench_memory_sft.main(SMALL + ["--gradient-checkpointing", "--json", str(tmp_path / "out.json")])
    ours = result["frameworks"]["ours"]
    assert result["config"]["gradient_checkpointing"] is True
    assert ours["step_time_s"]["n"] == 1 and ours["peak_rss_mb"] > 0 and ours["info"]["sequence_length"] == 18


def test_phases_split_the_peak():
    params = 1024 * 1024  # 4 MiB of float32 weights
    out = bench_memory.phases("dpo", params, peak_mb=100.0)
    assert out["weights"] == out["grads"] == out["reference"] == pytest.approx(4.0) and out["adam"] == pytest.approx(8.0)
    assert sum(out.values()) == pytest.approx(100.0) and out["activations_logits_runtime"] == pytest.approx(80.0)
    ppo = bench_memory.phases("ppo", params, peak_mb=100.0)
    assert ppo["value_weights_grads_adam"] == pytest.approx(16.0) and ppo["reward_model"] == pytest.approx(4.0)
