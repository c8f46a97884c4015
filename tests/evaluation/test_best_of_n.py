"""Best-of-N sampling as an evaluation baseline: the best of each prompt's N seeded samples, and
its KL to the policy, log N - (N-1)/N."""

from __future__ import annotations

import math

import pytest

from lit_rlhf.evaluation import best_of_n, generate_completions
from lit_rlhf.generation import SamplingConfig
from lit_rlhf.models import load_causal_lm, load_tokenizer
from lit_rlhf.rewards import CharacterFractionReward


def test_best_of_n_keeps_each_prompts_best_sample(one_thread):
    tok = load_tokenizer("tiny-random-llama")
    policy = load_causal_lm("tiny-random-llama", tok)
    prompts = ["hello", "tell me"]
    ids = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
    sampling = SamplingConfig(max_new_tokens=6, temperature=1.0)
    reward = CharacterFractionReward()
    out = best_of_n(policy, tok, prompts, ids, 4, reward, sampling, seed=3)
    # the same seeded samples, scored here: each prompt's maximum is kept
    samples = generate_completions(policy, tok, [i for i in ids for _ in range(4)], sampling, seed=3)
    scores = reward([p for p in prompts for _ in range(4)], samples)
    for k in range(2):
        group = scores[4 * k: 4 * k + 4]
        assert out.rewards[k] == pytest.approx(max(group))
        assert out.completions[k] == samples[4 * k + group.index(max(group))]
    assert out.mean_reward == pytest.approx(sum(scores) / 8)
    assert out.kl == pytest.approx(math.log(4) - 0.75)
    with pytest.raises(ValueError, match="do_sample"):
        best_of_n(policy, tok, prompts, ids, 4, reward, SamplingConfig(do_sample=False))
