"""The miniature's task: one-digit arithmetic answered with ONE token, scored by a graded reward.

A prompt is `Question: What is 3 + 4?\\nAnswer: ` (the trailing space is its own token for
SmolLM2, which writes " 7" as " " then "7"), and a completion is exactly one token: the policy's
next-token distribution at the end of the prompt is its whole answer space. That makes every
evaluation exact (`exact.py`: expected reward, KL and win rates as sums over the vocabulary, no
sampling) and the triplets cheap (one categorical draw each).

Problems (`problems`): every distinct a + b (a + b <= 9), a * b (a * b <= 9) and a + b - c
(0 <= result <= 9) with one-digit operands, 767 in all, shuffled once with a fixed seed and cut
into disjoint validation, training and held-out slices. The starting SmolLM2-135M-Instruct
puts ~95% of its mass on digit tokens and ~10-36% on the right one depending on the operation
(measured on 40 problems of each kind), so the reward is neither saturated nor sparse.

Reward (`graded_rewards`): a digit token d scores 1 - |d - answer| / 9 (1 when right, 0 when
off by 9), any other token 0. Dense and graded, in [0, 1], exact.

A completion has no EOS here (D3's EOS ends a free-text completion; a one-token answer space
is what makes the exact expectations possible).
"""

from __future__ import annotations

import random
from typing import Any, Callable, Sequence

import torch
from torch import Tensor

PROMPT_TEMPLATE = "Question: What is {question}?\nAnswer: "
PROBLEM_SEED = 1234  # the one shuffle of the problems; never changed between runs

TokenRewards = Callable[[Tensor, int], Tensor]  # (digit values (V,), answer) -> rewards (V,)


def problems(seed: int = PROBLEM_SEED) -> list[dict[str, Any]]:
    """Every distinct problem {question, answer}, in a fixed shuffled order."""
    out: dict[str, int] = {}
    digits = range(10)
    for a in digits:
        for b in digits:
            if a + b <= 9:
                out[f"{a} + {b}"] = a + b
            if a * b <= 9:
                out[f"{a} * {b}"] = a * b
            for c in digits:
                if 0 <= a + b - c <= 9:
                    out[f"{a} + {b} - {c}"] = a + b - c
    rows = [{"question": q, "answer": v} for q, v in sorted(out.items())]
    random.Random(seed).shuffle(rows)
    return rows


def split_problems(val: int, train: int, test: int, seed: int = PROBLEM_SEED) -> dict[str, list[dict[str, Any]]]:
    """Disjoint slices of `problems`: [0, val) validation, then `train` training, then `test` held out."""
    rows = problems(seed)
    if val + train + test > len(rows):
        raise ValueError(f"val_prompts + train_prompts + test_prompts = {val + train + test} exceeds the "
                         f"{len(rows)} distinct problems")
    return {"val": rows[:val], "train": rows[val:val + train], "test": rows[val + train:val + train + test]}


def prompt_rows(tokenizer: Any, rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Problems as prompt rows: prompt text, `_prompt_ids` (as the data modules encode plain
    prompts), answer."""
    from lit_rlhf.data.formatting import encode_prompt

    out = []
    for row in rows:
        prompt = PROMPT_TEMPLATE.format(question=row["question"])
        out.append({"prompt": prompt, "answer": int(row["answer"]), "_prompt_ids": encode_prompt(tokenizer, prompt)})
    return out


def digit_values(tokenizer: Any, vocabulary_size: int) -> Tensor:
    """(V,) long: the digit a token stands for (its text is exactly one of "0".."9"), else -1.
    `vocabulary_size` is the model's output size (it may exceed the tokenizer's)."""
    values = torch.full((vocabulary_size,), -1, dtype=torch.long)
    for d in range(10):
        for token_id in {tokenizer.convert_tokens_to_ids(str(d))} | set(tokenizer(str(d), add_special_tokens=False)["input_ids"]):
            if token_id is not None and 0 <= token_id < vocabulary_size and tokenizer.decode([token_id]) == str(d):
                values[token_id] = d
    if int((values >= 0).sum()) != 10:
        raise ValueError(f"the tokenizer has {int((values >= 0).sum())} single-digit tokens, not 10: "
                         "a one-digit answer is not one token")
    return values


def graded_rewards(values: Tensor, answer: int) -> Tensor:
    """(V,) float64 rewards of every token for one problem: 1 - |d - answer| / 9 for a digit
    token d, 0 for any other token."""
    digit = values >= 0
    closeness = 1.0 - (values - int(answer)).abs().double() / 9.0
    return torch.where(digit, closeness, torch.zeros_like(closeness))


def reward_matrix(rows: Sequence[dict[str, Any]], values: Tensor, token_rewards: TokenRewards = graded_rewards) -> Tensor:
    """(P, V) float64: the reward of every token for every prompt row."""
    return torch.stack([token_rewards(values, row["answer"]) for row in rows])
