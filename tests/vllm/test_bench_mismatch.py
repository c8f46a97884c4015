"""benchmarks/bench_mismatch.py on the tiny model: one GRPO step sampling with its own vLLM engine
logs every mismatch statistic, finite, and the table renders (its SmolLM2 run is in RESULTS.md)."""

from __future__ import annotations

import math

from benchmarks import bench_mismatch
from lit_rlhf.generation.vllm_process import live_in_process_engines


def test_the_mismatch_benchmark_measures_every_statistic(vllm_model_dir, engine, tmp_path):
    engines = live_in_process_engines()  # the session's (the last live core keeps the shared state)
    result = bench_mismatch.main(["--model", vllm_model_dir, "--steps", "1", "--temperatures", "1.0", "0.7",
                                  "--max-new-tokens", "4", "--json", str(tmp_path / "m.json")])
    assert set(result["per_temperature"]) == {"1.0", "0.7"}
    for rows in result["per_temperature"].values():
        (row,) = rows
        assert set(row) == set(bench_mismatch.STATS) and all(math.isfinite(v) for v in row.values())
        assert row["kl_k3"] >= 0 and 0 <= row["masked_fraction"] <= 1
        assert row["ratio_min"] <= row["ratio_p05"] <= row["ratio_p50"] <= row["ratio_p95"] <= row["ratio_max"]
    assert "| 0.7 |" in bench_mismatch.render(result)
    assert live_in_process_engines() == engines  # each temperature's engine shut down with its run
