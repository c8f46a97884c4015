"""Smoke test of benchmarks/bench_lora.py: LoRA and full DPO side by side on the tiny model."""

from __future__ import annotations

import pytest

from benchmarks import bench_lora


@pytest.mark.slow  # two worker processes
def test_bench_lora_reports_memory_and_time_of_each_variant(tmp_path):
    out = bench_lora.main(["--model", "tiny-random-llama", "--methods", "dpo", "--variants", "full,lora", "--rounds", "1",
                           "--warmup", "1", "--steps", "1", "--batch-size", "2", "--prompt-length", "12",
                           "--completion-length", "6", "--lora-r", "4", "--json", str(tmp_path / "out.json")])
    entry = out["methods"]["dpo"]
    assert set(entry) == {"full", "lora"}
    for variant in entry.values():
        assert variant["peak_step_rss_mb"] > 0 and variant["step_time_median_s"] > 0
    assert out["ratios"]["dpo_lora_over_full_peak"] > 0
    assert (tmp_path / "out.json").is_file()
    assert out["config"]["lora"]["r"] == 4
