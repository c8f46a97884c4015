"""Smoke test of benchmarks/bench_memory*.py: the SFT worker runs one measured step with gradient
checkpointing on the tiny model (in process, ours only); the by-phase arithmetic; the profiled
step's categories (the model states are where the arithmetic puts them)."""

from __future__ import annotations

import json

import pytest

from benchmarks import bench_memory, bench_memory_phases, bench_memory_sft

SMALL = ["--model", "tiny-random-llama", "--warmup", "1", "--steps", "1", "--rounds", "1", "--frameworks", "ours",
         "--in-process", "--batch-size", "1", "--prompt-length", "12", "--completion-length", "6"]


def test_sft_memory_worker_runs_with_gradient_checkpointing(tmp_path):
    result = bench_memory_sft.main(SMALL + ["--gradient-checkpointing", "--json", str(tmp_path / "out.json")])
    ours = result["frameworks"]["ours"]
    assert result["config"]["gradient_checkpointing"] is True
    assert ours["step_time_s"]["n"] == 1 and ours["peak_rss_mb"] > 0 and ours["info"]["sequence_length"] == 18


def test_phases_split_the_peak():
    params = 1024 * 1024  # 4 MiB of float32 weights
    runtime = bench_memory.RUNTIME_MB
    out = bench_memory.phases("dpo", params, peak_mb=runtime + 100.0, logprob_mb=3.0, checkpoint_mb=2.0)
    assert out["weights"] == out["grads"] == out["reference"] == pytest.approx(4.0) and out["adam"] == pytest.approx(8.0)
    assert out["logprob_chunks"] == 3.0 and out["checkpointed_layer_inputs"] == 2.0 and "activations" not in out
    assert sum(out.values()) == pytest.approx(runtime + 100.0) and out["other"] == pytest.approx(100.0 - 20.0 - 5.0)
    ppo = bench_memory.phases("ppo", params, peak_mb=runtime + 100.0)
    assert ppo["value_weights_grads_adam"] == pytest.approx(16.0) and ppo["reward_model"] == pytest.approx(4.0)
    assert "reference" not in bench_memory.phases("sft", params, peak_mb=runtime + 100.0)


def test_activations_are_what_checkpointing_removes():
    sizes = {"parameters": 1024 * 1024, "vocab": 1000, "hidden": 16, "layers": 2}
    peak = bench_memory.RUNTIME_MB + 100.0
    cells = {False: {"ours": {"peak_rss_mb": peak + 30.0}, "trl": {"peak_rss_mb": peak + 80.0}},
             True: {"ours": {"peak_rss_mb": peak}, "trl": {"peak_rss_mb": peak + 10.0}}}
    bench_memory.add_phases(cells, "sft", sizes, rows=1, seq=64)
    kept = bench_memory.checkpoint_inputs_mb(2, 1, 64, 16)
    assert kept == pytest.approx(2 * 64 * 16 * 4 / 2**20)
    assert cells[False]["phases_mb"]["activations"] == pytest.approx(30.0 + kept)
    assert cells[True]["phases_mb"]["checkpointed_layer_inputs"] == pytest.approx(kept)
    assert cells[False]["phases_mb"]["other"] == pytest.approx(cells[True]["phases_mb"]["other"])  # by construction
    assert cells[False]["checkpointing_saved_mb"] == {"ours": pytest.approx(30.0), "trl": pytest.approx(70.0)}
    assert bench_memory.logprob_working_set_mb(1000, 16, chunk=8) == pytest.approx((2 * 8 * 1000 + 1000 * 16) * 4 / 2**20)


def test_reuse_takes_earlier_runs_of_the_same_shape_only(tmp_path):
    earlier = {"model": "m", "prompt_length": 4, "completion_length": 8,
               "cells": [{"method": "sft", "gradient_checkpointing": True, "ours": {"peak_rss_mb": 1.0},
                          "trl": {"peak_rss_mb": 2.0}},
                         {"method": "dpo", "gradient_checkpointing": False, "trl": {"error": "exit 1"}}]}
    path = tmp_path / "earlier.json"
    path.write_text(json.dumps(earlier))
    now = {"model": "m", "prompt_length": 4, "completion_length": 8}
    assert bench_memory.reusable_runs(str(path), now, ["trl"]) == {("sft", True, "trl"): {"peak_rss_mb": 2.0}}
    assert set(bench_memory.reusable_runs(str(path), now, ["ours", "trl"])) == {("sft", True, "trl"), ("sft", True, "ours")}
    with pytest.raises(SystemExit, match="not"):
        bench_memory.reusable_runs(str(path), {**now, "completion_length": 16}, ["trl"])


def test_markdown_tables_of_a_result():
    sizes = {"parameters": 1024 * 1024, "vocab": 1000, "hidden": 16, "layers": 2}
    peak = bench_memory.RUNTIME_MB + 100.0
    cells = {False: {"method": "sft", "gradient_checkpointing": False, "dense_logits_mb": 1.0,
                     "ours": {"peak_rss_mb": peak + 30.0}, "trl": {"error": "exit 1"}},
             True: {"method": "sft", "gradient_checkpointing": True, "dense_logits_mb": 1.0, "ours": {"peak_rss_mb": peak},
                    "trl": {"peak_rss_mb": peak * 2}, "ours_over_trl": 0.5, "goal": 0.6, "goal_met": True}}
    bench_memory.add_phases(cells, "sft", sizes, rows=1, seq=64)
    text = bench_memory.markdown({"cells": [cells[False], cells[True]]})
    assert f"| SFT | off | {peak + 30:.0f} | error | - | - | 1 |" in text
    assert f"| SFT | on | {peak:.0f} | {2 * peak:.0f} | 0.50x | <= 0.6x: met | 1 |" in text
    assert "activations" in text and "checkpointed_layer_inputs" in text


def test_profiled_step_files_the_model_states_under_their_categories():
    result = bench_memory_phases.main(["--model", "tiny-random-llama", "--method", "sft", "--gradient-checkpointing",
                                       "--prompt-length", "12", "--completion-length", "6", "--threads", "1"])
    from lit_rlhf.models import load_causal_lm, load_tokenizer

    weights_mb = sum(p.numel() for p in load_causal_lm("tiny-random-llama", load_tokenizer("tiny-random-llama")).parameters()) * 4 / 2**20
    peaks = result["category_peaks_mb"]
    assert peaks["parameter"] == pytest.approx(weights_mb, rel=0.01)
    assert peaks["optimizer_state"] == pytest.approx(2 * weights_mb, rel=0.01)  # AdamW's two moments, second step
    assert weights_mb * 0.99 <= peaks["gradient"] <= 2 * weights_mb  # every weight gets a gradient
    assert result["peak_mb"] >= peaks["parameter"] + peaks["optimizer_state"]


def test_optimizer_in_backward_flag_reaches_our_worker_and_the_phases(tmp_path):
    result = bench_memory_sft.main(SMALL + ["--optimizer-in-backward", "--json", str(tmp_path / "out.json")])
    assert result["config"]["extra"]["optimizer_in_backward"] is True
    assert result["frameworks"]["ours"]["bare_time_s"]["n"] == 1  # the textbook step ran beside it (hooks suspended)
    params = 1024 * 1024
    out = bench_memory.phases("sft", params, peak_mb=bench_memory.RUNTIME_MB + 100.0, grads_mb=1.0)
    assert out["grads"] == 1.0 and out["weights"] == pytest.approx(4.0)
    earlier = tmp_path / "earlier.json"
    earlier.write_text(json.dumps({"model": "m", "prompt_length": 4, "completion_length": 8, "cells": []}))
    now = {"model": "m", "prompt_length": 4, "completion_length": 8, "optimizer_in_backward": True}
    assert bench_memory.reusable_runs(str(earlier), now, ["trl"]) == {}
    with pytest.raises(SystemExit, match="optimizer-in-backward"):
        bench_memory.reusable_runs(str(earlier), now, ["ours", "trl"])


def test_profiled_step_with_optimizer_in_backward_holds_one_gradient_at_a_time():
    result = bench_memory_phases.main(["--model", "tiny-random-llama", "--method", "sft", "--optimizer-in-backward",
                                       "--prompt-length", "12", "--completion-length", "6", "--threads", "1"])
    from lit_rlhf.models import load_causal_lm, load_tokenizer

    params = list(load_causal_lm("tiny-random-llama", load_tokenizer("tiny-random-llama")).parameters())
    largest_mb = max(p.numel() for p in params) * 4 / 2**20
    weights_mb = sum(p.numel() for p in params) * 4 / 2**20
    peaks = result["category_peaks_mb"]
    assert peaks["optimizer_state"] == pytest.approx(2 * weights_mb, rel=0.01)  # the same AdamW moments
    assert peaks["gradient"] <= largest_mb * 1.01 < weights_mb  # never more than one parameter's gradient
