"""The DRO single-trajectory replication (experiments/dro_single_trajectory): its data module,
statistics, and the whole driver on a tiny model (the `smoke` budget, same code path as `full`)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from experiments.dro_single_trajectory import run as driver
from experiments.dro_single_trajectory.triplets import (
    TripletDataModule,
    examples_for,
    read_triplets,
    reward_statistics,
    sample_completions,
    write_triplets,
)
from lit_rlhf.generation import SamplingConfig
from lit_rlhf.types import PreferenceBatch, SFTBatch, SingleBatch


def _triplet(p, j, reward):
    return {"prompt_index": p, "sample_index": j, "prompt": f"q{p}", "reference": "1", "completion": f"c{p}.{j}",
            "reward": reward, "prompt_ids": [5, 6, 7][: p + 1], "completion_ids": [10 + j, 20 + j, 2]}


# prompt 0: rewards 1, 0, 1 ; prompt 1: 0, 0, 0 (no pair) ; prompt 2: 0, 1, 0
REWARDS = {0: [1.0, 0.0, 1.0], 1: [0.0, 0.0, 0.0], 2: [0.0, 1.0, 0.0]}


@pytest.fixture
def triplet_file(tmp_path):
    rows = [_triplet(p, j, r) for p, rs in REWARDS.items() for j, r in enumerate(rs)]
    return write_triplets(tmp_path / "triplets.jsonl", rows)


def test_reward_statistics_are_the_population_mean_and_std(triplet_file):
    stats = reward_statistics(read_triplets(triplet_file))
    assert stats["count"] == 9
    assert stats["mean"] == pytest.approx(3 / 9)
    assert stats["std"] == pytest.approx(math.sqrt(3 / 9 * 6 / 9))  # Bernoulli(1/3)


def test_single_mode_normalises_rewards_to_mean_0_variance_1(triplet_file):
    dm = TripletDataModule(triplet_file, "single", pad_token_id=0, batch_size=9)
    (batch,) = list(dm.train_dataloader())
    assert isinstance(batch, SingleBatch) and dm.batch_type() is SingleBatch
    assert batch.rewards.mean().item() == pytest.approx(0.0, abs=1e-6)
    assert batch.rewards.var(correction=0).item() == pytest.approx(1.0, abs=1e-5)
    raw = torch.tensor(batch.meta["reward"])
    assert torch.equal(batch.rewards > 0, raw > 3 / 9)  # KTO's "above the mean" is the raw order


def test_pairs_mode_takes_best_and_worst_of_each_prompt_and_drops_ties(triplet_file):
    examples = examples_for(read_triplets(triplet_file), "pairs", {"mean": 1 / 3})
    assert [(e["prompt"], e["chosen"], e["rejected"]) for e in examples] == [("q0", "c0.0", "c0.1"),
                                                                              ("q2", "c2.1", "c2.0")]
    dm = TripletDataModule(triplet_file, "pairs", pad_token_id=0, batch_size=4)  # 2 pairs a batch
    (batch,) = list(dm.train_dataloader())
    assert isinstance(batch, PreferenceBatch) and batch.num_pairs == 2


def test_sft_mode_keeps_the_above_mean_completions(triplet_file):
    examples = examples_for(read_triplets(triplet_file), "sft", {"mean": 1 / 3})
    assert sorted(e["completion"] for e in examples) == ["c0.0", "c0.2", "c2.1"]
    dm = TripletDataModule(triplet_file, "sft", pad_token_id=0, batch_size=3)
    (batch,) = list(dm.train_dataloader())
    assert isinstance(batch, SFTBatch)
    assert batch.loss_mask.sum().item() == 9  # 3 completions of 3 tokens


def test_bad_triplet_files_are_refused(tmp_path):
    path = write_triplets(tmp_path / "t.jsonl", [dict(_triplet(0, 0, 1.0), reward=float("nan"))])
    with pytest.raises(ValueError, match="not finite"):
        read_triplets(path)
    path = write_triplets(tmp_path / "u.jsonl", [_triplet(0, j, 1.0) for j in range(3)])
    with pytest.raises(ValueError, match="cannot be normalised"):
        TripletDataModule(path, "single", pad_token_id=0, batch_size=2)
    path = write_triplets(tmp_path / "v.jsonl", [_triplet(0, 0, 1.0), _triplet(0, 1, 0.0)])
    with pytest.raises(ValueError, match="fewer than one batch"):
        TripletDataModule(path, "sft", pad_token_id=0, batch_size=2)
    with pytest.raises(ValueError, match="unknown mode"):
        TripletDataModule(path, "pointwise", pad_token_id=0)


def test_balanced_kto_weight_is_the_undesirable_to_desirable_ratio(triplet_file):
    assert driver.balanced_desirable_weight(read_triplets(triplet_file)) == pytest.approx(6 / 3)


def test_win_rate_counts_ties_half():
    ours = [[1.0, 0.0], [1.0, 1.0]]
    theirs = [[0.0, 0.0], [1.0, 0.0]]
    assert driver.win_rate(ours, theirs) == pytest.approx((1 + 0.5 + 0.5 + 1) / 4)
    with pytest.raises(ValueError):
        driver.win_rate(ours, theirs[:1])


def test_binary_rewards_make_the_win_rate_redundant():
    # with 0/1 scores the win rate is 1/2 + (mean difference)/2 exactly, which is why it is dropped
    ours, theirs = [[1.0, 0.0], [1.0, 1.0], [0.0, 0.0]], [[0.0, 0.0], [1.0, 0.0], [1.0, 0.0]]
    diff = sum(a - b for ra, rb in zip(ours, theirs) for a, b in zip(ra, rb)) / 6
    assert driver.win_rate(ours, theirs) == pytest.approx(0.5 + diff / 2)
    run = {"greedy_rewards": [1.0, 0.0], "sampled_rewards": ours}
    assert driver.is_binary([run])
    assert not driver.is_binary([dict(run, sampled_rewards=[[0.5, 0.0]])])


def test_comparison_pairs_seeds_and_prompts_and_broadcasts_the_start():
    def run(greedy, sampled):
        return {"greedy_rewards": greedy, "sampled_rewards": [[v] for v in sampled]}

    ours = [run([1, 1, 0, 1], [1, 0, 1, 1]), run([1, 0, 1, 1], [1, 1, 1, 0])]
    start = [run([0, 0, 0, 1], [0, 0, 1, 0])]
    out = driver.comparison(ours, start, num_resamples=500, seed=0, with_win_rate=False)
    assert out["accuracy"]["mean"] == pytest.approx((2 + 2) / 8)
    assert out["mean_reward"]["mean"] == pytest.approx((2 + 2) / 8)
    # per-prompt differences averaged over seeds, accuracy: [1, 0.5, 0.5, 0]: 3 positive, none negative
    assert out["accuracy"]["sign_test"] == {"positive": 3, "negative": 0, "ties": 1, "p_value": 0.25}
    assert out["accuracy"]["low"] <= out["accuracy"]["mean"] <= out["accuracy"]["high"]
    assert "win_rate_per_seed" not in out
    graded = driver.comparison(ours, start, num_resamples=50, seed=0, with_win_rate=True)
    assert len(graded["win_rate_per_seed"]) == 2


def test_choose_lr_prefers_accuracy_then_reward_then_the_smaller_lr():
    sweep = [{"lr": 1e-5, "val_accuracy": 0.5, "val_mean_reward": 0.2},
             {"lr": 3e-6, "val_accuracy": 0.5, "val_mean_reward": 0.2},
             {"lr": 3e-5, "val_accuracy": 0.4, "val_mean_reward": 0.9}]
    assert driver.choose_lr(sweep) == 3e-6
    sweep[0]["val_mean_reward"] = 0.3
    assert driver.choose_lr(sweep) == 1e-5


def test_budget_and_arms_refuse_unknown_names():
    with pytest.raises(ValueError, match="unknown budget knob"):
        driver.load_budget("smoke", {"stpes": 3})
    with pytest.raises(ValueError, match="unknown profile"):
        driver.load_budget("huge")
    with pytest.raises(ValueError, match="sweep_seed 1 is also a reported seed"):
        driver.load_budget("smoke", {"sweep_seed": 1})
    with pytest.raises(ValueError, match="unknown arm"):
        driver.load_arms(["drov", "ppo"])
    assert set(driver.load_arms()) == {"drov", "drov_single_value", "drov_shared_network", "kto_tau5",
                                       "kto_tau5_balanced", "kto_tau0.1", "dpo", "sft_rejection"}


def test_sampling_is_reproducible_per_chunk():
    from lit_rlhf import models

    tokenizer = models.load_tokenizer(models.TINY_RANDOM_LLAMA)
    model = models.load_causal_lm(models.TINY_RANDOM_LLAMA, tokenizer).eval()
    rows = [{"_prompt_ids": tokenizer.encode(f"{i} + {i} =", add_special_tokens=False)} for i in range(4)]
    config = SamplingConfig(max_new_tokens=6, temperature=1.0)
    first = sample_completions(model, tokenizer, rows, 3, config, seed=7, chunk=2)
    torch.manual_seed(12345)  # the global stream before the call does not matter
    again = sample_completions(model, tokenizer, rows, 3, config, seed=7, chunk=2)
    other = sample_completions(model, tokenizer, rows, 3, config, seed=8, chunk=2)
    ids = lambda s: [[c["completion_ids"] for c in per_prompt] for per_prompt in s]  # noqa: E731
    assert ids(first) == ids(again)
    assert ids(first) != ids(other)
    assert len(first) == 4 and all(len(p) == 3 for p in first)


def parity_reward(prompts, completions, reference):
    """An exact, programmatic reward that a random tiny model earns half the time (the
    arithmetic reward would be 0 everywhere, and constant rewards cannot be normalised)."""
    assert len(prompts) == len(completions) == len(reference)
    return [float(len(c) % 2) for c in completions]


def test_driver_end_to_end_on_a_tiny_model(tmp_path):
    out = tmp_path / "out"
    results = driver.run("smoke", out, reward_fn=parity_reward, log=lambda _: None)
    budget = results["budget"]
    arms = driver.load_arms()

    # the triplets: k per training prompt, rewards from the exact reward
    triplets = read_triplets(out / "triplets.jsonl")
    assert len(triplets) == budget["train_prompts"] * budget["samples_per_prompt"] == results["data"]["triplets"]
    assert all(t["reward"] == parity_reward([""], [t["completion"]], [""])[0] for t in triplets)

    # every arm: its sweep, the chosen lr, every seed, finite numbers and ordered intervals
    assert list(results["arms"]) == list(arms)
    assert budget["sweep_seed"] not in budget["seeds"]
    for name, row in results["arms"].items():
        assert [s["lr"] for s in row["sweep"]] == arms[name]["lrs"]
        assert row["lr"] == driver.choose_lr(row["sweep"])
        assert [r["seed"] for r in row["per_seed"]] == budget["seeds"]
        cells = [row[k] for k in ("accuracy", "mean_reward", "kl")]
        cells += [row["versus_start"][k] for k in ("accuracy", "mean_reward")]
        if name != driver.REFERENCE_ARM:
            cells += [row["versus_" + driver.REFERENCE_ARM][k] for k in ("accuracy", "mean_reward")]
        for cell in cells:
            assert all(math.isfinite(cell[k]) for k in ("mean", "low", "high", "p_value"))
            assert cell["low"] <= cell["mean"] <= cell["high"]
            assert (cell["seeds"], cell["prompts"]) == (len(budget["seeds"]), budget["test_prompts"])
        for key in ("accuracy", "mean_reward"):  # proportions: intervals inside [0, 1]
            assert 0.0 <= row[key]["low"] <= row[key]["high"] <= 1.0
    assert results["start"]["kl"] == 0.0  # the starting policy against itself
    assert results["start"]["versus_drov"] == results["arms"]["drov"]["versus_start"]
    assert results["binary_rewards"]  # the parity reward is 0/1: no win rate
    assert "win_rate_per_seed" not in results["arms"]["dpo"]["versus_drov"]

    # the outputs, with every per-prompt score of every run
    on_disk = json.loads((out / "results.json").read_text())
    assert on_disk["arms"].keys() == results["arms"].keys()
    samples = json.loads((out / "samples.json").read_text())
    assert len(samples["test_prompts"]) == budget["test_prompts"]
    assert len(samples["start"]["greedy_rewards"]) == budget["test_prompts"]
    for name in arms:
        runs = samples["arms"][name]["runs"]
        assert [r["seed"] for r in runs] == budget["seeds"]
        assert all(len(r["sampled_rewards"]) == len(r["kl_per_prompt"]) == budget["test_prompts"] for r in runs)
    mean = sum(sum(r["greedy_rewards"]) for r in samples["arms"]["dpo"]["runs"]) / (2 * budget["test_prompts"])
    assert results["arms"]["dpo"]["accuracy"]["mean"] == pytest.approx(mean)  # the table is the samples' mean
    table = (out / "results.md").read_text()
    for name in arms:
        assert f"| {name} |" in table
    assert "| start (no training) |" in table and "win rate" in table
    png = (out / "reward_vs_kl.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 1000
