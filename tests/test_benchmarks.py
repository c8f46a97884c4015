"""Smoke tests of benchmarks/: every script runs 1 warm-up + 1 measured step on the tiny model,
in process and without TRL, and reports what the issue asks for; the report arithmetic."""

from __future__ import annotations

import importlib
import json
import statistics

import pytest

from benchmarks import common

SMALL = ["--model", "tiny-random-llama", "--warmup", "1", "--steps", "1", "--rounds", "1", "--frameworks", "ours",
         "--in-process", "--batch-size", "2", "--prompt-length", "12", "--completion-length", "6"]


@pytest.mark.parametrize("name", ["reward", "dpo", "kto", "drov", "grpo", "ppo"])
def test_script_runs_one_measured_step(name, tmp_path):
    module = importlib.import_module(f"benchmarks.bench_{name}")
    extra = ["--generations", "2"] if name == "grpo" else ["--ppo-epochs", "2"] if name == "ppo" else []
    result = module.main(SMALL + extra + ["--json", str(tmp_path / "out.json")])
    ours = result["frameworks"]["ours"]
    assert ours["step_time_s"]["n"] == 1 and ours["step_time_s"]["median"] > 0
    assert ours["tokens_per_s"] > 0 and ours["peak_rss_mb"] > 0
    assert ours["overhead_ratio"]["median"] > 0 and ours["bare_parts_s"]  # bare work timed on the same batch
    assert "ours_over_trl" not in result
    assert (tmp_path / "out.json").exists()
    if name in ("grpo", "ppo"):
        assert ours["generation_time_s"]["n"] == 1 and ours["update_time_s"]["median"] > 0
        assert ours["completions_per_s"] > 0
        assert "generate" in ours["bare_parts_s"]
    if name == "ppo":
        assert ours["optimizer_steps_per_step"] == 2


def test_token_rows_have_exact_lengths():
    from lit_rlhf import models

    tok = models.load_tokenizer("tiny-random-llama")
    rows = common.token_rows(tok, 3, 20, 5)
    for row in rows:
        assert len(row["prompt_ids"]) == 20 and len(row["chosen_ids"]) == 5 and len(row["rejected_ids"]) == 5
        assert row["chosen_ids"][-1] == tok.eos_token_id and row["rejected_ids"][-1] == tok.eos_token_id
    assert any(row["chosen_ids"] != row["rejected_ids"] for row in common.token_rows(tok, 3, 20, 30))
    batch = common.preference_batch(rows)
    assert batch.input_ids.shape == (6, 25) and bool(batch.attention_mask.all())
    assert int(batch.loss_mask.sum()) == 6 * 5


def test_aggregate_ratios_and_overhead():
    cfg = common.BenchConfig(steps=3)
    runs = [
        common.WorkerResult("ours", [1.0, 2.0, 3.0], 100.0, 10.0, bare_times=[1.0, 1.0, 2.0]),
        common.WorkerResult("trl", [4.0, 4.0, 4.0], 200.0, 10.0),
        common.WorkerResult("ours", [2.0, 2.0, 2.0], 120.0, 10.0, bare_times=[2.0, 2.0, 2.0]),
        common.WorkerResult("trl", [2.0, 2.0, 2.0], 150.0, 10.0),
    ]
    out = common.aggregate("dpo", cfg, runs, (0.5, 0.5, 0.5), (0.6, 0.6, 0.6))
    ours = out["frameworks"]["ours"]
    assert ours["step_time_s"] == {"median": 2.0, "min": 1.0, "max": 3.0, "n": 6}
    assert ours["peak_rss_mb"] == 120.0 and ours["tokens_per_s"] == 5.0
    assert ours["overhead_ratio"]["median"] == 1.0 and ours["overhead_ratio"]["max"] == 2.0  # per step / its bare step
    assert out["ours_over_trl"]["step_time"] == pytest.approx(2.0 / 3.0)  # pooled medians 2 / 3
    assert out["ours_over_trl"]["step_time_per_round"] == [0.5, 1.0]
    assert out["ours_over_trl"]["peak_rss"] == pytest.approx(120 / 200)
    assert "ours/TRL" in common.format_report(out)


def test_bad_flags_are_refused():
    with pytest.raises(SystemExit, match="--steps must be >= 1"):
        common.parse_config(["--steps", "0"], "x")
    with pytest.raises(SystemExit, match="no TRL counterpart"):
        common.frameworks_of(common.BenchConfig(frameworks="ours,trl"), has_trl_worker=False)


def test_logprobs_bench_measures_dense_and_chunked_side_by_side(tmp_path):
    from benchmarks import bench_logprobs

    report = bench_logprobs.main(["--model", "tiny-random-llama", "--prompt-length", "8", "--completion-length", "12",
                                  "--chunk-sizes", "5", "--warmup", "0", "--steps", "1", "--in-process",
                                  "--json", str(tmp_path / "lp.json")])
    got = {(r["scope"], r["variant"]): r for r in report["results"]}
    assert set(got) == {(s, v) for s in ("head", "model") for v in ("dense", "chunked:5")}
    for scope in ("head", "model"):
        dense, chunked = got[scope, "dense"], got[scope, "chunked:5"]
        assert dense["time_s"] > 0 and chunked["step_peak_rss_mb"] > 0 and dense["scored_tokens"] == 2 * 12
        assert abs(dense["loss"] - chunked["loss"]) < 1e-5  # the same log-probs
    assert (tmp_path / "lp.json").exists()


def test_async_bench_runs_sync_and_async_on_the_tiny_model(tmp_path):
    from benchmarks import bench_async

    results = bench_async.main(["--model", "tiny-random-llama", "--rollouts", "3", "--generations", "2",
                                "--new-tokens", "4", "--prompt-tokens", "128", "--modes", "sync", "async_hf",
                                "--json", str(tmp_path / "out.json")])
    assert [r["mode"] for r in results] == ["sync", "async_hf"]
    for r in results:
        assert r["samples_per_s"] > 0 and 0 <= r["trainer_idle_fraction"] <= 1 and len(r["step_durations_s"]) == 2
    assert results[0]["staleness_max"] == 0.0 and results[1]["staleness_max"] == 1.0
    saved = json.loads((tmp_path / "out.json").read_text())
    assert saved["created"] and saved["machine"]["cpus"] and len(saved["load_before"]) == 3


def test_compare_commits_runs_both_trees_in_turn(tmp_path, monkeypatch):
    """HEAD against itself on the tiny model: both trees are checked out and removed again, each
    pair's ratio is head / base, and the order alternates between pairs."""
    from benchmarks import compare_commits

    calls = []
    real = compare_commits.step_median

    def recorded(tree, method, bench_args, out):
        calls.append(tree.name)
        return real(tree, method, bench_args, out)

    monkeypatch.setattr(compare_commits, "step_median", recorded)
    result = compare_commits.main(["--base", "HEAD", "--methods", "dpo", "--pairs", "2", "--json", str(tmp_path / "c.json"),
                                   "--", *SMALL[:6], "--batch-size", "2", "--prompt-length", "12", "--completion-length", "6"])
    assert calls == ["base", "head", "head", "base"]  # base first, then head first
    figures = result["methods"]["dpo"]
    assert [p["ratio"] for p in figures["pairs"]] == [p["head"] / p["base"] for p in figures["pairs"]]
    assert figures["ratio_min"] <= figures["ratio_median"] <= figures["ratio_max"]
    assert all(p["base_peak_rss_mb"] > 0 and p["head_peak_rss_mb"] > 0 for p in figures["pairs"])
    assert figures["head_peak_rss_mb_median"] == statistics.median(p["head_peak_rss_mb"] for p in figures["pairs"])
    assert json.loads((tmp_path / "c.json").read_text())["base"] == result["head"]
    trees = [line.split()[0] for line in compare_commits.git("worktree", "list").splitlines()]
    assert not any(tree.endswith(("/base", "/head")) for tree in trees)  # both removed


def test_results_md_shows_the_vllm_mismatch_file():
    """The vLLM mismatch table in RESULTS.md is its committed file rendered (bench_mismatch.py --write)."""
    import json

    from benchmarks import bench_mismatch
    from benchmarks.gpu.report import RESULTS_MD

    result = json.loads((RESULTS_MD.parent / "results" / "mismatch_vllm_cpu.json").read_text())
    shown = RESULTS_MD.read_text().split(bench_mismatch.BEGIN, 1)[1].split(bench_mismatch.END, 1)[0].strip("\n")
    assert shown == bench_mismatch.render(result)


def test_results_md_shows_the_vllm_top_p_mismatch_file():
    """The top-p table (the learner's replay on and off) in RESULTS.md is its committed file rendered."""
    import json

    from benchmarks import bench_mismatch
    from benchmarks.gpu.report import RESULTS_MD

    result = json.loads((RESULTS_MD.parent / "results" / "mismatch_vllm_cpu_top_p.json").read_text())
    shown = RESULTS_MD.read_text().split(bench_mismatch.FILTER_BEGIN, 1)[1].split(bench_mismatch.FILTER_END, 1)[0]
    assert shown.strip("\n") == bench_mismatch.render(result)
    assert result["top_p"] == 0.9 and {"1.0", "1.0, replay off"} <= set(result["per_temperature"])
