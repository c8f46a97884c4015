"""benchmarks/bench_layouts.py runs (tiny model, one step) and counts fewer model tokens shared."""

from __future__ import annotations

from benchmarks import bench_layouts


def test_bench_layouts_times_both_layouts_of_every_method(tmp_path):
    out = tmp_path / "layouts.json"
    result = bench_layouts.main(["--model", "tiny-random-llama", "--steps", "1", "--warmup", "0", "--threads", "1",
                                 "--pairs", "2", "--prompts", "1", "--prompt-min", "12", "--prompt-max", "20",
                                 "--completion-min", "3", "--completion-max", "6", "--long-completion", "9",
                                 "--out", str(out)])
    assert out.is_file() and [m["method"] for m in result["methods"]] == ["dpo", "reward", "grpo"]
    for method in result["methods"]:
        assert set(method["median_step_s"]) == {"padded", "shared"} and method["speedup_padded_over_shared"] > 0
        tokens = method["tokens_per_step"]
        assert tokens["shared_tokens"] < tokens["real_tokens"] <= tokens["padded_tokens"]
