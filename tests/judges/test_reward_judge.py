"""RewardModelJudge with a plain callable and with an exported sequence-classification model."""

from __future__ import annotations

import math

import pytest
import torch

from lit_rlhf.judges import RewardModelJudge


def length_reward(prompts, completions):
    return [float(len(c)) for c in completions]


def test_higher_reward_wins_equal_rewards_tie():
    judge = RewardModelJudge(length_reward)
    judgements = judge.judge(["p"] * 3, ["long answer", "x", "abc"], ["short", "longer one", "xyz"])
    assert [j.winner for j in judgements] == ["a", "b", "tie"]
    assert judgements[0].raw == "reward_a=11.0 reward_b=5.0"
    assert not any(j.swapped for j in judgements) and all(j.error is None for j in judgements)


def test_tensor_rewards_and_non_finite_rewards():
    def reward_fn(prompts, completions):
        table = {"good": 1.0, "bad": -1.0, "nan": math.nan}
        return torch.tensor([table[c] for c in completions], requires_grad=True)

    judgements = RewardModelJudge(reward_fn).judge(["p", "p"], ["bad", "nan"], ["good", "good"])
    assert [j.winner for j in judgements] == ["b", "invalid"]
    assert judgements[1].error == "non-finite reward"


def test_reward_fn_is_called_once_on_all_texts_and_lengths_are_checked():
    calls = []

    def reward_fn(prompts, completions):
        calls.append((list(prompts), list(completions)))
        return [0.0] * len(completions)

    judge = RewardModelJudge(reward_fn)
    judge.judge(["p1", "p2"], ["a1", "a2"], ["b1", "b2"])
    assert calls == [(["p1", "p2", "p1", "p2"], ["a1", "a2", "b1", "b2"])]
    assert judge.judge([], [], []) == []
    with pytest.raises(ValueError):
        judge.judge(["p"], ["a", "b"], ["c"])
    with pytest.raises(ValueError):
        RewardModelJudge(lambda p, c: [0.0]).judge(["p", "q"], ["a", "b"], ["c", "d"])


def test_from_pretrained_scores_at_the_last_token_batched(tmp_path, tiny_tokenizer):
    from transformers import LlamaConfig, LlamaForSequenceClassification

    config = LlamaConfig(vocab_size=len(tiny_tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, num_labels=1,
                         pad_token_id=tiny_tokenizer.pad_token_id)
    torch.manual_seed(0)
    LlamaForSequenceClassification(config).save_pretrained(tmp_path)

    prompts = ["POST: a\n\nTL;DR:", "POST: something longer\n\nTL;DR:", "POST: c\n\nTL;DR:"]
    a = [" short", " a much longer summary", " x"]
    b = [" another one here", " y", " x"]
    judge = RewardModelJudge.from_pretrained(str(tmp_path), tokenizer_name="tiny-random-llama", batch_size=2)
    reward_fn = judge.reward_fn

    # by hand: one unpadded sequence at a time, prompt + completion + EOS, score of the last token
    def by_hand(p, c):
        ids = tiny_tokenizer(p + c + tiny_tokenizer.eos_token, return_tensors="pt")
        with torch.no_grad():
            return reward_fn.model(**ids).logits[0, 0].item()

    batched = reward_fn(prompts + prompts, a + b)
    expected = [by_hand(p, c) for p, c in zip(prompts + prompts, a + b)]
    assert batched.tolist() == pytest.approx(expected, abs=1e-5)

    judgements = judge.judge(prompts, a, b)
    r_a, r_b = expected[:3], expected[3:]
    assert judgements[0].winner == ("a" if r_a[0] > r_b[0] else "b")
    assert judgements[1].winner == ("a" if r_a[1] > r_b[1] else "b")
    assert judgements[2].winner == "tie"  # the same text scores the same
