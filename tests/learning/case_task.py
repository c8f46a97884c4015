"""The online learning task: a reward that depends on the prompt.

Half the prompts are written in lowercase, half in uppercase. The wanted tokens are the letters
of the prompt's case (`CaseReward`). Each wanted token of the response scores +1/R and each token
of the other case -1/R, so the optimum is 1 (R wanted tokens, no EOS). A policy that ignores the
prompt scores exactly 0 in expectation on prompts split half and half (what it gains on one case
it loses on the other), and the training and held-out prompts are split so. Only a policy that
reads the prompt gains. (With the case marked by the prompt's last character alone, "?" or ":",
the tiny model learned nothing in 8 rollouts; a prompt written in the case is easy to read.)

On top of that, each prompt carries an offset that no response changes, as real prompts differ
in how much reward they allow: 3 x (its number of words - 3), so -3, 0 or +3. A baseline taken
within a prompt's own responses (a group, a pair, the greedy response) cancels it exactly. A
baseline taken across prompts (groups laid out across prompts, rewards paired with the wrong
rows) carries it as noise several times the size of the signal.

`expected_case_reward` measures the policy's expected reward without the offset on held-out
prompts, from its logits, as `tasks.expected_letter_reward` does for letters: at each sampled
prefix it adds the policy's probability of a wanted token minus that of the other case. The
random policy starts near 0. `kl_to_reference` measures KL(policy || reference) per response on
the same sampled prefixes (the exact KL of each next-token distribution, summed over the reached
positions).
"""

from __future__ import annotations

import random
from typing import Any, Sequence

import torch
from torch import Tensor

from lit_rlhf.data.collate import pad_left
from lit_rlhf.generation import SamplingConfig, generate_responses
from tests.learning.tasks import WORDS, encode

LOWER = "abcdefghijklmnopqrstuvwxyz"
UPPER = LOWER.upper()


def case_prompts(n: int, seed: int, exclude: Sequence[str] = ()) -> list[str]:
    """`n` distinct prompts of 2-4 words drawn from `seed` (ending in "?" or ":"), alternately in
    lowercase and in uppercase (half of each for even `n`), none of them in `exclude`."""
    rng = random.Random(seed)
    prompts: list[str] = []
    while len(prompts) < n:
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 4))) + rng.choice("?:")
        text = text.upper() if len(prompts) % 2 else text
        if text not in prompts and text not in exclude:
            prompts.append(text)
    return prompts


def is_upper(prompt: str) -> bool:
    """Whether the prompt is written in uppercase (its wanted case is then uppercase)."""
    return prompt == prompt.upper()


def offset(prompt: str) -> float:
    """The prompt's reward offset: 3 x (its number of words - 3)."""
    return 3.0 * (len(prompt.split()) - 3)


def case_ids(tokenizer) -> tuple[list[int], list[int]]:
    """The token ids of the lowercase and of the uppercase letters (one token each)."""
    lower = [tokenizer.convert_tokens_to_ids(c) for c in LOWER]
    upper = [tokenizer.convert_tokens_to_ids(c) for c in UPPER]
    assert len(set(lower + upper)) == 2 * len(LOWER), "the tiny tokenizer has one token per letter"
    return lower, upper


def wanted_sign(tokenizer, prompt: str) -> Tensor:
    """(V,) +1 on the prompt's wanted case, -1 on the other case, 0 elsewhere."""
    lower, upper = case_ids(tokenizer)
    wanted, other = (upper, lower) if is_upper(prompt) else (lower, upper)
    sign = torch.zeros(len(tokenizer))
    sign[wanted], sign[other] = 1.0, -1.0
    return sign


class CaseReward:
    """Reward function: offset(prompt) + (wanted tokens - tokens of the other case) / R, where the
    wanted case is the prompt's (the module docstring).

    The completions arrive as text; re-encoding them with the byte-level tokenizer gives back the
    sampled tokens' letters exactly (see `tasks.LetterReward`)."""

    def __init__(self, tokenizer, length: int) -> None:
        self.tokenizer, self.length = tokenizer, length
        self.lower, self.upper = (set(ids) for ids in case_ids(tokenizer))

    def __call__(self, prompts: list[str], completions: list[str], **columns: Any) -> list[float]:
        encoded = self.tokenizer(list(completions), add_special_tokens=False)["input_ids"]
        rewards = []
        for prompt, row in zip(prompts, encoded):
            wanted, other = (self.upper, self.lower) if is_upper(prompt) else (self.lower, self.upper)
            rewards.append(offset(prompt) + (sum(t in wanted for t in row) - sum(t in other for t in row)) / self.length)
        return rewards


@torch.no_grad()
def _next_token_logps(models, tokenizer, prompts: Sequence[str], length: int, temperature: float, samples: int,
                      seed: int) -> tuple[list[Tensor], Tensor]:
    """`samples` responses per prompt sampled from `models[0]` with a generator seeded by `seed`;
    returns each model's next-token log-probs at the response positions (N, R, V) and the
    response mask (N, R), N = len(prompts) * samples, a prompt's samples contiguous."""
    policy = models[0]
    was_training = [m.training for m in models]
    for m in models:
        m.eval()
    try:
        ids, mask = pad_left([encode(tokenizer, p) for p in prompts for _ in range(samples)], tokenizer.pad_token_id)
        mask = mask.bool()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            response_ids, response_mask, _ = generate_responses(
                policy, ids, mask, SamplingConfig(max_new_tokens=length, temperature=temperature),
                tokenizer.eos_token_id, tokenizer.pad_token_id)
        input_ids = torch.cat([ids, response_ids], dim=1)  # (N, P+R)
        attention = torch.cat([mask, torch.ones_like(response_mask)], dim=1)
        positions = (attention.long().cumsum(dim=1) - 1).clamp(min=0)
        width = ids.shape[1]
        out = []
        for m in models:
            logits = m(input_ids=input_ids, attention_mask=attention.long(), position_ids=positions).logits
            out.append((logits[:, width - 1: width + length - 1].float() / temperature).log_softmax(dim=-1))
        return out, response_mask.float()
    finally:
        for m, was in zip(models, was_training):
            m.train(was)


def expected_case_reward(policy, tokenizer, prompts: Sequence[str], length: int, temperature: float,
                         samples: int = 32, seed: int = 1234) -> float:
    """E[CaseReward - offset] of `policy` on `prompts`: at every reached response position, the
    probability of a wanted token minus that of the other case given the sampled prefix, over R."""
    (logps,), mask = _next_token_logps([policy], tokenizer, prompts, length, temperature, samples, seed)
    sign = torch.stack([wanted_sign(tokenizer, p) for p in prompts]).repeat_interleave(samples, dim=0)  # (N, V)
    per_position = (logps.exp() * sign[:, None, :]).sum(dim=-1)  # (N, R)
    return float((per_position * mask).sum(dim=1).mean() / length)


def kl_to_reference(policy, ref, tokenizer, prompts: Sequence[str], length: int, temperature: float,
                    samples: int = 32, seed: int = 1234) -> float:
    """Mean over sampled responses of sum_t KL(policy || ref) of the next-token distributions at
    the reached positions (nats per response; 0 when the policy is the reference)."""
    (p, q), mask = _next_token_logps([policy, ref], tokenizer, prompts, length, temperature, samples, seed)
    kl = (p.exp() * (p - q)).sum(dim=-1)  # (N, R)
    return float((kl * mask).sum(dim=1).mean())
