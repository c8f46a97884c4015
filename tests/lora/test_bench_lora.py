"""Smoke tests of benchmarks/bench_lora.py (LoRA and full DPO side by side on the tiny model) and
benchmarks/bench_lora_phases.py (a LoRA DPO step's memory by phase)."""

from __future__ import annotations

import pytest

from benchmarks import bench_lora, bench_lora_phases


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


@pytest.mark.slow  # two worker processes
def test_bench_lora_phases_split_the_dpo_step_by_phase_and_tensor_category(tmp_path):
    out = bench_lora_phases.main(["--phase-variants", "lora,bare", "--tensors", "--model", "tiny-random-llama",
                                  "--warmup", "1", "--steps", "1", "--batch-size", "2", "--prompt-length", "12",
                                  "--completion-length", "6", "--lora-r", "4", "--json", str(tmp_path / "phases.json")])
    expected = ["step start", "reference forward", "policy forward", "loss", "backward"]
    for variant in ("lora", "bare"):
        result = out["phases"][variant]
        names = [p["phase"] for p in result["phases"]]
        assert names[:5] == expected and names[-1] == "optimizer step", (variant, names)
        start = result["step_start"]["rss_mb"]
        assert result["rss_runtime_mb"] <= result["rss_model_mb"] and start > 0
        assert all(p["peak_mb"] >= p["rss_start_mb"] > 0 for p in result["phases"])
        assert result["step_peak_mb"] == max(p["peak_mb"] for p in result["phases"])
        assert result["step_start"]["malloc_system_mb"] >= result["step_start"]["malloc_in_use_mb"] > 0
        # the profiled step: every phase's live tensors, with the (frozen and LoRA) weights as parameters
        tensors = result["tensors"]
        profiled = [p["phase"] for p in tensors["phases"]]  # the phases that allocated tensors
        assert {"reference forward", "policy forward", "backward"} <= set(profiled) <= set(names), profiled
        peak = tensors["step_peak"]
        assert peak["total_mb"] >= max(p["total_mb"] for p in tensors["phases"]) - 1e-9
        assert peak["parameter"] > 0 and abs(sum(v for k, v in peak.items() if k != "total_mb") - peak["total_mb"]) < 1e-6
    assert (tmp_path / "phases.json").is_file()


def test_bench_lora_phases_flag_runs_bench_lora_phases_with_the_other_flags(monkeypatch):
    seen = []
    monkeypatch.setattr(bench_lora_phases, "main", lambda argv: seen.append(argv) or {"phases": {}})
    assert bench_lora.main(["--phases", "--phase-variants", "bare", "--model", "tiny-random-llama"]) == {"phases": {}}
    assert seen == [["--phase-variants", "bare", "--model", "tiny-random-llama"]]
