"""The DRO single-trajectory replication (experiments/dro_single_trajectory): its task, its exact
quantities and statistics by hand, its data module, and the whole driver on a tiny model (the
`smoke` budget, same code path as `full`)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from experiments.dro_single_trajectory import exact, reading, report, task
from experiments.dro_single_trajectory import run as driver
from experiments.dro_single_trajectory.triplets import (
    TripletDataModule,
    examples_for,
    read_triplets,
    reward_statistics,
    write_triplets,
)
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


def test_budget_and_arms_refuse_unknown_names():
    with pytest.raises(ValueError, match="unknown budget knob"):
        driver.load_budget("smoke", {"stpes": 3})
    with pytest.raises(ValueError, match="unknown profile"):
        driver.load_budget("huge")
    with pytest.raises(ValueError, match="sweep_seed 1 is also a reported seed"):
        driver.load_budget("smoke", {"sweep_seed": 1})
    with pytest.raises(ValueError, match="unknown arm"):
        driver.load_arms(["drov", "ppo"])
    assert set(driver.load_arms()) == {"drov", "drov_single_value", "drov_shared_network", "kto", "dpo",
                                       "sft_rejection"}
    assert list(driver.load_arms(["drov", "drov_value_first"])) == ["drov", "drov_value_first"]  # optional: by name




# ------------------------------------------------------------------------------------------------
# the task and its exact quantities
# ------------------------------------------------------------------------------------------------

def test_problems_are_distinct_one_digit_and_split_disjointly():
    rows = task.problems()
    assert len(rows) == len({r["question"] for r in rows}) == 767
    assert all(0 <= r["answer"] <= 9 and eval(r["question"]) == r["answer"] for r in rows)  # noqa: S307
    assert task.problems() == rows  # one fixed shuffle
    split = task.split_problems(5, 7, 3)
    questions = [{r["question"] for r in split[k]} for k in ("val", "train", "test")]
    assert [len(q) for q in questions] == [5, 7, 3] and not (questions[0] & questions[1] or questions[1] & questions[2]
                                                               or questions[0] & questions[2])
    with pytest.raises(ValueError, match="767 distinct problems"):
        task.split_problems(400, 400, 1)


def test_graded_reward_by_hand(tiny_tokenizer):
    values = task.digit_values(tiny_tokenizer, len(tiny_tokenizer))
    assert sorted(values[values >= 0].tolist()) == list(range(10))
    rewards = task.graded_rewards(values, 7)
    seven, two = tiny_tokenizer.convert_tokens_to_ids("7"), tiny_tokenizer.convert_tokens_to_ids("2")
    assert rewards[seven].item() == 1.0 and rewards[two].item() == pytest.approx(1 - 5 / 9)
    assert rewards[tiny_tokenizer.convert_tokens_to_ids("a")].item() == 0.0  # not a digit
    assert task.graded_rewards(values, 0)[tiny_tokenizer.convert_tokens_to_ids("9")].item() == 0.0
    row = task.prompt_rows(tiny_tokenizer, [{"question": "3 + 4", "answer": 7}])[0]
    assert row["prompt"] == "Question: What is 3 + 4?\nAnswer: " and row["answer"] == 7


def test_exact_quantities_by_hand():
    logp = torch.tensor([[0.5, 0.25, 0.25]], dtype=torch.float64).log()
    logq = torch.tensor([[0.25, 0.25, 0.5]], dtype=torch.float64).log()
    rewards = torch.tensor([[1.0, 0.0, 0.5]], dtype=torch.float64)
    assert exact.expected_reward(logp, rewards).item() == pytest.approx(0.5 + 0.125)
    assert exact.greedy_reward(logp, rewards).item() == 1.0
    # KL(p || q) = 0.5 ln 2 + 0.25 ln 1 + 0.25 ln 0.5 = 0.25 ln 2
    assert exact.kl(logp, logq).item() == pytest.approx(0.25 * math.log(2))
    assert exact.kl(logp, logp).item() == 0.0
    # win rate of p over q on levels 0 < 0.5 < 1 with p = (0.25, 0.25, 0.5), q = (0.25, 0.5, 0.25):
    # wins 0.25*0 + 0.25*0.25 + 0.5*0.75 = 0.4375; ties 0.25*0.25 + 0.25*0.5 + 0.5*0.25 = 0.3125 -> 0.59375
    assert exact.level_masses(logp, rewards).tolist() == [[0.25, 0.25, 0.5]]
    assert exact.win_rate(logp, logq, rewards).item() == pytest.approx(0.59375)
    assert (exact.win_rate(logp, logq, rewards) + exact.win_rate(logq, logp, rewards)).item() == pytest.approx(1.0)
    # tokens with equal rewards are one level: a tie between them
    same = torch.tensor([[0.5, 0.5, 0.5]], dtype=torch.float64)
    assert exact.win_rate(logp, logq, same).item() == pytest.approx(0.5)
    # Theorem 1's optimum, q uniform on two tokens, r = (1, 0), tau = 1: pi* = (e, 1) / (e + 1)
    star = exact.regularised_optimum(torch.tensor([[0.5, 0.5]], dtype=torch.float64).log(), torch.tensor([[1.0, 0.0]], dtype=torch.float64), 1.0)
    assert star.exp().tolist()[0] == pytest.approx([math.e / (1 + math.e), 1 / (1 + math.e)])
    draws = exact.sample(logp.repeat(2, 1), 4000, seed=3)
    assert torch.equal(draws, exact.sample(logp.repeat(2, 1), 4000, seed=3))
    assert (draws == 0).double().mean().item() == pytest.approx(0.5, abs=0.03)


def test_next_token_logprobs_read_the_last_prompt_token(tiny_tokenizer, tiny_model):
    rows = task.prompt_rows(tiny_tokenizer, task.problems()[:3])
    logp = exact.next_token_logprobs(tiny_model, rows, tiny_tokenizer.pad_token_id, batch_size=2)
    for i, row in enumerate(rows):  # one row alone, no padding
        with torch.no_grad():
            alone = tiny_model(input_ids=torch.tensor([row["_prompt_ids"]])).logits[0, -1].double().log_softmax(-1)
        torch.testing.assert_close(logp[i], alone, atol=1e-5, rtol=0)
    assert logp.exp().sum(-1).tolist() == pytest.approx([1.0] * 3)


def test_comparison_pairs_cells_and_broadcasts_the_start():
    def run(expected, greedy, levels):
        return {"expected_reward": expected, "greedy_reward": greedy, "levels": levels}

    ours = [run([0.5, 0.75], [1.0, 1.0], [[0.5, 0.5], [0.0, 1.0]]), run([0.25, 0.75], [0.0, 1.0], [[0.5, 0.5], [0.5, 0.5]])]
    start = [run([0.25, 0.5], [0.0, 1.0], [[1.0, 0.0], [0.5, 0.5]])]
    out = report.comparison(ours, start, num_resamples=300, seed=0)
    # differences: seed 1 (0.25, 0.25), seed 2 (0, 0.25): mean 0.1875; per-prompt (0.125, 0.25): 2 positive
    assert out["expected_reward"]["mean"] == pytest.approx(0.1875)
    assert out["expected_reward"]["sign_test"] == {"positive": 2, "negative": 0, "ties": 0, "p_value": 0.5}
    # win rates, sum over levels of p * (q below + q equal / 2): seed 1 prompt 0, p = (.5, .5) vs q = (1, 0):
    # .5 * (0 + .5) + .5 * (1 + 0) = .75; seed 1 prompt 1 .75; seed 2 prompt 0 .75; seed 2 prompt 1 (equal) .5
    assert out["win_rate"]["mean"] == pytest.approx((0.75 + 0.75 + 0.75 + 0.5) / 4)
    assert 0.0 <= out["win_rate"]["low"] <= out["win_rate"]["high"] <= 1.0
    with pytest.raises(ValueError, match="seeds against"):
        report.comparison(ours, ours * 2, num_resamples=10, seed=0)


def test_settings_grid_and_choice():
    arm = {"sweep": {"lr": [1e-5, 3e-5, 1e-4], "beta": [0.1, 5.0]}}
    grid = driver.settings_grid(arm, sweep=True)
    assert grid[:2] == [{"lr": 1e-5, "beta": 0.1}, {"lr": 1e-5, "beta": 5.0}] and len(grid) == 6
    assert driver.settings_grid(arm, sweep=False) == [{"lr": 3e-5, "beta": 5.0}]
    sweep = [{"params": {"lr": 1e-5}, "val_expected_reward": 0.6}, {"params": {"lr": 3e-5}, "val_expected_reward": 0.6},
             {"params": {"lr": 1e-4}, "val_expected_reward": 0.5}]
    assert driver.choose(sweep) == {"lr": 1e-5}  # a tie goes to the first (smaller lr)
    sweep[1]["val_expected_reward"] = 0.7
    assert driver.choose(sweep) == {"lr": 3e-5}


def dense_rewards(values, answer):
    """A graded reward a random tiny model earns at every token (the digit reward would be ~0
    almost everywhere for it): token id modulo 5, over 4."""
    return (torch.arange(values.shape[0]) % 5).double() / 4


def test_driver_end_to_end_on_a_tiny_model(tmp_path):
    out = tmp_path / "out"
    names = list(driver.load_arms()) + ["drov_value_first"]  # every default arm and the optional one
    results = driver.run("smoke", out, arms=names, token_rewards=dense_rewards, log=lambda _: None)
    budget = results["budget"]
    arms = driver.load_arms(names)

    # the triplets: k exact draws per training prompt, scored by the reward
    triplets = read_triplets(out / "triplets.jsonl")
    assert len(triplets) == budget["train_prompts"] * budget["samples_per_prompt"] == results["data"]["triplets"]
    assert all(len(t["completion_ids"]) == 1 and t["reward"] == (t["completion_ids"][0] % 5) / 4 for t in triplets)

    # every arm: equal passes, the chosen settings, every seed, finite numbers and ordered intervals
    assert list(results["arms"]) == list(arms)
    assert budget["sweep_seed"] not in budget["seeds"]
    examples = results["data"]["examples_per_mode"]
    for name, row in results["arms"].items():
        per_step = budget["batch_size"] // 2 if arms[name]["data"] == "pairs" else budget["batch_size"]
        value_first = arms[name].get("value_first_epochs", 0)  # value-only passes before the joint ones
        assert row["steps"] == (budget["epochs"] + value_first) * (examples[arms[name]["data"]] // per_step)
        assert row["params"] == driver.settings_grid(arms[name], sweep=False)[0]
        assert [r["seed"] for r in row["per_seed"]] == budget["seeds"]
        cells = [row[k] for k in ("expected_reward", "greedy_reward", "kl", "win_rate_vs_start")]
        cells += [row["versus_start"][k] for k in ("expected_reward", "greedy_reward", "win_rate")]
        if name != driver.REFERENCE_ARM:
            cells += [row["versus_" + driver.REFERENCE_ARM][k] for k in ("expected_reward", "win_rate")]
        for cell in cells:
            assert all(math.isfinite(cell[k]) for k in ("mean", "low", "high", "p_value"))
            assert cell["low"] <= cell["mean"] <= cell["high"]
            assert (cell["seeds"], cell["prompts"]) == (len(budget["seeds"]), budget["test_prompts"])
        for key in ("expected_reward", "greedy_reward", "win_rate_vs_start"):  # in [0, 1]
            assert 0.0 <= row[key]["low"] <= row[key]["high"] <= 1.0
        assert row["kl"]["low"] >= 0.0  # an exact KL is never negative
        for key in ("value_r2", "value_r2_train"):  # held-out and training prompts
            r2 = [r[key] for r in row["per_seed"]]
            if name in ("drov", "drov_shared_network", "drov_value_first"):  # a per-prompt value: its fit is measured
                assert all(r is not None and math.isfinite(r) for r in r2)
            else:
                assert r2 == [None] * len(budget["seeds"])
    assert results["start"]["versus_drov"] == results["arms"]["drov"]["versus_start"]
    assert results["start"]["win_rate_vs_start"]["mean"] == pytest.approx(0.5)  # against itself: all ties, half
    assert results["optimum"]["kl"] > 0 and results["optimum"]["expected_reward"] > results["start"]["expected_reward"]["mean"]

    # the outputs, with every per-prompt number of every run
    samples = json.loads((out / "samples.json").read_text())
    assert len(samples["test_prompts"]) == budget["test_prompts"]
    for name in arms:
        runs = samples["arms"][name]["runs"]
        assert [r["seed"] for r in runs] == budget["seeds"]
        assert all(len(r["expected_reward"]) == len(r["kl"]) == len(r["levels"]) == budget["test_prompts"] for r in runs)
    mean = sum(sum(r["expected_reward"]) for r in samples["arms"]["dpo"]["runs"]) / (2 * budget["test_prompts"])
    assert results["arms"]["dpo"]["expected_reward"]["mean"] == pytest.approx(mean)  # the table is the samples' mean
    table = (out / "results.md").read_text()
    for name in arms:
        assert f"| {name} |" in table
    assert "| start (no training) |" in table and "| optimum pi*" in table
    png = (out / "reward_vs_kl.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 1000

    # the second reading, from the same files (reading.py): every arm read, pi* where Eq. 8 with
    # V(x) converges, and the level-scale pi* equal to the token-scale one the driver computed
    second = json.loads((out / "reading.json").read_text())
    assert list(second["arms"]) == ["start"] + list(arms)
    assert second["fixed_points"]["per_prompt"]["expected_reward"] == pytest.approx(results["optimum"]["expected_reward"])
    assert second["fixed_points"]["per_prompt"]["kl"] == pytest.approx(results["optimum"]["kl"])
    tau, mean, std = second["tau"], second["reward_mean"], second["reward_std"]
    for name in arms:  # J = E[r_norm] - tau KL, the mean of the table's numbers
        row = results["arms"][name]
        assert second["arms"][name]["objective"]["mean"] == pytest.approx(
            (row["expected_reward"]["mean"] - mean) / std - tau * row["kl"]["mean"])
        assert second["arms"][name]["kl_to_optimum"]["low"] >= 0.0
    assert (out / "reading.md").read_text() == reading.markdown(second)
    assert (out / "frontier.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_single_batches_hold_whole_prompts_shuffled_each_epoch(tmp_path, tiny_tokenizer):
    """`single` mode: every batch is the draws of whole prompts (so the prompt forward is shared),
    the prompts reshuffled each epoch; a draw count that does not divide the batch is refused."""
    rows = [{"prompt_index": p, "sample_index": j, "prompt": f"p{p}", "completion": str(j), "reward": float(p + j),
             "prompt_ids": [5, 6, p + 7], "completion_ids": [j + 20]} for p in range(6) for j in range(2)]
    path = write_triplets(tmp_path / "t.jsonl", rows)
    data = TripletDataModule(path, "single", tiny_tokenizer.pad_token_id, batch_size=4, seed=0)
    loader = data.train_dataloader()
    epochs = [[b.meta["prompt"] for b in loader] for _ in range(2)]
    for batches in epochs:
        assert len(batches) == 3
        for prompts in batches:
            assert len(prompts) == 4 and all(prompts.count(p) == 2 for p in prompts)  # two whole prompts
        assert sorted(p for b in batches for p in b) == sorted(r["prompt"] for r in rows)
    assert epochs[0] != epochs[1]
    batch = next(iter(loader))
    assert batch.prompt_groups.tolist() == [0, 0, 1, 1]
    with pytest.raises(ValueError, match="dividing"):
        TripletDataModule(path, "single", tiny_tokenizer.pad_token_id, batch_size=3)


def test_sample_mean_fit_is_the_r_squared_of_the_memorised_draws():
    from experiments.dro_single_trajectory.measures import sample_mean_fit

    start_logp = torch.log(torch.tensor([[0.5, 0.5], [0.5, 0.5]], dtype=torch.float64))
    normalised = torch.tensor([[1.0, -1.0], [0.5, 0.5]], dtype=torch.float64)  # start's V(x): 0 and 0.5
    triplets = [{"prompt_index": 0, "reward": 3.0}, {"prompt_index": 0, "reward": 3.0},
                {"prompt_index": 1, "reward": 2.0}]  # raw; normalised with mean 1, std 2: 1, 1 and 0.5
    # per-prompt means (1, 0.5) against (0, 0.5): MSE 0.5, Var 0.0625 -> R^2 = 1 - 8 = -7
    assert sample_mean_fit(triplets, start_logp, normalised, mean=1.0, std=2.0) == pytest.approx(-7.0)
    with pytest.raises(ValueError, match="1 training prompts have no triplet"):
        sample_mean_fit(triplets[:2], start_logp, normalised, mean=1.0, std=2.0)
