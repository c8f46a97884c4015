"""The N+ miniature with a synthetic gold (experiments/nplus_gold): its configuration, its
statistics by hand, and the whole driver on a tiny model (the `smoke` budget, the same code path
as `full`: every stage through the CLI, every policy evaluated, the report written)."""

from __future__ import annotations

import json
import math

import pytest

from experiments.nplus_gold import report
from experiments.nplus_gold import run as driver


def test_stage_configs_write_under_out_with_the_profiles_model_seed_and_overrides(tmp_path):
    budget = driver.load_budget("smoke", {"seed": 7})
    config = driver.stage_config("reward", budget, tmp_path)
    assert config["seed_everything"] == 7
    assert config["model"]["init_args"]["model"] == str(tmp_path / "sft_model")  # from the SFT policy (N+)
    assert config["model"]["init_args"]["export_dir"] == str(tmp_path / "reward_model")
    assert config["model"]["init_args"]["lora"]["init_args"]["layers_to_transform"] == [1]
    assert config["trainer"]["callbacks"][1]["init_args"]["data_args"]["val_split"] == "validation_sft[:4]"
    sft = driver.stage_config("sft", budget, tmp_path)
    assert sft["model"]["init_args"]["model"] == "tiny-random-smollm2"
    full = driver.load_budget("full")
    assert driver.stage_config("sft", full, tmp_path)["model"]["init_args"]["model"] == "smollm2-135m-instruct"
    with pytest.raises(ValueError, match="unknown budget knob"):
        driver.load_budget("smoke", {"seeds": [1]})


def test_every_proxy_arm_starts_from_sft_and_logs_the_gold_it_does_not_optimise(tmp_path):
    budget = driver.load_budget("full")
    for stage in ("dpo", "ppo", "grpo", "grpo_gold", "grpo_past_kl"):
        args = driver.stage_config(stage, budget, tmp_path)["model"]["init_args"]
        assert args["model"] == str(tmp_path / "sft_model"), stage
        if stage in ("ppo", "grpo", "grpo_past_kl"):
            assert args["reward_model"] == str(tmp_path / "reward_model")
            assert args["reward_weights"] == [1.0, 0.0]  # the gold: logged, weight 0
    gold = driver.stage_config("grpo_gold", budget, tmp_path)["model"]["init_args"]
    grpo = driver.stage_config("grpo", budget, tmp_path)["model"]["init_args"]
    assert "reward_model" not in gold and "reward_weights" not in gold
    same = {k for k in grpo if k not in ("reward_model", "reward_weights", "export_dir")}
    assert {k: gold[k] for k in same} == {k: grpo[k] for k in same}  # the control differs only in its reward


def test_length_buckets_and_comparisons_by_hand():
    buckets = report.length_buckets([-1.0, -0.2, 0.1, 0.3, 2.0], [0.0, 0.5, 0.5, 1.0, 0.0], [-0.5, 0.0, 0.5])
    assert [b["n"] for b in buckets] == [1, 1, 2, 1]
    assert buckets[2]["win_rate"]["rate"] == pytest.approx(0.75)
    c = report.compare([0.0, 0.5, 0.5, 1.0], [1.0, 0.5, 1.0, 1.0])
    assert c["mean_diff"] == pytest.approx(0.375) and c["win_rate"]["rate"] == pytest.approx(0.75)
    assert (c["sign_test"]["positive"], c["sign_test"]["negative"], c["sign_test"]["ties"]) == (2, 0, 2)


def _policy(gold, proxy):
    n = len(gold)
    return {"gold": gold, "proxy": proxy, "tokens": [5] * n, "ended": [True] * n}


def test_over_optimisation_is_shown_only_when_the_proxy_rises_and_the_gold_falls():
    n = 12
    up, down = [0.1 * i for i in range(n)], [0.2 + 0.02 * (i % 3) for i in range(n)]
    base = {name: _policy([0.5] * n, [0.0] * n) for name in ("start", "sft", "dpo", "ppo", "grpo", "grpo_gold")}
    evaluation = {"reward_model": {"agreement_with_gold": {"ci_low": 0.6}}}
    rising = {**base, "grpo_past_kl@1": _policy([0.8] * n, [0.0] * n), "grpo_past_kl@2": _policy(down, up)}
    r4 = report.decisions(rising, evaluation)["R4_over_optimisation"]
    assert r4["shown"] and r4["best_earlier_gold"] == "grpo_past_kl@1"
    flat = {**base, "grpo_past_kl@1": _policy([0.2] * n, [0.0] * n), "grpo_past_kl@2": _policy([0.9] * n, up)}
    assert not report.decisions(flat, evaluation)["R4_over_optimisation"]["shown"]
    assert report.decisions(flat, evaluation)["R2_agreement_above_chance"] is True


@pytest.mark.slow
def test_driver_end_to_end_on_a_tiny_model(tmp_path):
    results = driver.run("smoke", tmp_path, log=lambda _: None)
    assert set(results["stages"]) == set(driver.STAGES)
    assert list(results["policies"]) == ["start", "sft", "dpo", "ppo", "grpo", "grpo_gold",
                                         "grpo_past_kl@1", "grpo_past_kl@2"]
    for name, s in results["policies"].items():
        assert 0.0 <= s["gold"] <= 1.0 and s["win_rate_vs_reference"]["rate"] <= 0.5, name
        assert sum(b["n"] for b in s["win_rate_vs_reference_by_length"]) == 4
    assert results["reward_model"]["accuracy"]["n"] > 0 and "agreement_with_gold" in results["reward_model"]
    assert set(results["decisions"]["R1_vs_sft"]) == {"dpo", "ppo", "grpo", "grpo_gold"}
    assert "R4_over_optimisation" in results["decisions"]
    curves = results["training_curves"]
    assert all(k is not None for k in curves["grpo_past_kl"]["kl"]) and len(curves["grpo_past_kl"]["kl"]) == 2
    assert all(g is not None and 0 <= g <= 1 for g in curves["ppo"]["gold"])  # the weight-0 gold, logged
    assert all(p is None for p in curves["grpo_gold"]["proxy"])  # the control has no proxy
    samples = json.loads((tmp_path / "samples.json").read_text())
    assert all(len(p["texts"]) == 4 and len(p["gold"]) == 4 for p in samples["policies"].values())
    assert (tmp_path / "gold_vs_kl.png").stat().st_size > 0 and "R3" in (tmp_path / "results.md").read_text()
    assert math.isfinite(results["minutes"])
