"""Exact quantities of a one-token answer space (`task.py`): sums over the vocabulary, no sampling.

With pi(.|x) the policy's next-token distribution at the end of prompt x (log-probs `logp`, (P, V))
and r(x, .) the reward of every token (`rewards`, (P, V)), per prompt:

- expected reward  E_pi[r] = sum_v pi(v|x) r(x, v);
- greedy reward    r(x, argmax_v pi(v|x));
- KL(pi || q)      sum_v pi(v|x) (log pi(v|x) - log q(v|x)), >= 0 exactly (no estimator noise);
- win rate of pi against rho, independent draws y ~ pi, y' ~ rho:
  P(r(y) > r(y')) + 1/2 P(r(y) = r(y')), summed over the reward levels;
- the KL-regularised optimum the DRO objective targets (Richemond et al. 2024, Theorem 1):
  pi*(v|x) ∝ pi_ref(v|x) exp(r(x, v) / tau) for the rewards as trained on (normalised).

Triplets are drawn from the same distributions (`sample`): an exact categorical draw with a
seeded generator, so the training data and the evaluation use one definition of the policy.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import Tensor

from lit_rlhf.data.collate import pad_right


@torch.no_grad()
def next_token_logprobs(model: torch.nn.Module, rows: Sequence[dict[str, Any]], pad_token_id: int,
                        batch_size: int = 16) -> Tensor:
    """(P, V) float64 log-probs of the next token after each prompt (`_prompt_ids`), at
    temperature 1. Prompts are right padded, so positions 0..L-1 are the model's default (D5) and
    the distribution is read at each row's last prompt token."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    out = []
    for start in range(0, len(rows), batch_size):
        ids = [list(r["_prompt_ids"]) for r in rows[start:start + batch_size]]
        input_ids, mask = pad_right(ids, pad_token_id)
        last = torch.tensor([len(row) - 1 for row in ids])
        columns, row_column = torch.unique(last, return_inverse=True)  # the output layer on these columns only
        logits = model(input_ids=input_ids.to(device), attention_mask=mask.to(device),
                       logits_to_keep=columns.to(device)).logits  # (b, K, V)
        out.append(torch.log_softmax(logits[torch.arange(len(ids)), row_column.to(device)].double(), dim=-1).cpu())
    model.train(was_training)
    return torch.cat(out)


def expected_reward(logp: Tensor, rewards: Tensor) -> Tensor:
    """(P,) E_pi[r]."""
    return (logp.exp() * rewards).sum(-1)


def greedy_reward(logp: Tensor, rewards: Tensor) -> Tensor:
    """(P,) the reward of the most likely token (the greedy answer)."""
    return rewards.gather(-1, logp.argmax(-1, keepdim=True)).squeeze(-1)


def kl(logp: Tensor, logq: Tensor) -> Tensor:
    """(P,) KL(p || q) = sum_v p (log p - log q), clamped at 0 against rounding."""
    p = logp.exp()
    terms = torch.where(p > 0, p * (logp - logq), torch.zeros_like(p))
    return terms.sum(-1).clamp(min=0.0)


def level_masses(logp: Tensor, rewards: Tensor) -> Tensor:
    """(P, L) the probability of each reward level of each prompt, levels in ascending order (the
    distinct values of that prompt's reward row; rows with fewer levels are padded with zero mass
    at the end). Two policies' masses on one prompt share its levels, so the win rate needs only
    these (`win_rate_of_levels`), not the (P, V) distributions."""
    rows = []
    for lp, r in zip(logp, rewards):
        levels, index = torch.unique(r, return_inverse=True)  # ascending
        rows.append(torch.zeros(len(levels), dtype=torch.float64).index_add_(0, index, lp.exp().double()))
    width = max(len(row) for row in rows)
    return torch.stack([torch.cat([row, row.new_zeros(width - len(row))]) for row in rows])


def win_rate_of_levels(p: Tensor, q: Tensor) -> Tensor:
    """(P,) P(r(y) > r(y')) + 1/2 P(r(y) = r(y')) for independent draws with level masses p, q
    (`level_masses`, the same prompts)."""
    below = torch.cumsum(q, -1) - q  # mass of q strictly below each level
    return (p * (below + 0.5 * q)).sum(-1)


def win_rate(logp: Tensor, logq: Tensor, rewards: Tensor) -> Tensor:
    """(P,) the win rate of p against q on each prompt (independent draws, ties half)."""
    return win_rate_of_levels(level_masses(logp, rewards), level_masses(logq, rewards))


def regularised_optimum(logq: Tensor, rewards: Tensor, tau: float) -> Tensor:
    """(P, V) log pi* with pi* ∝ q exp(rewards / tau) (Theorem 1's optimum for reference q)."""
    if tau <= 0:
        raise ValueError(f"tau must be > 0, got {tau}")
    return torch.log_softmax(logq + rewards / tau, dim=-1)


def sample(logp: Tensor, k: int, seed: int) -> Tensor:
    """(P, k) token ids, k independent draws per prompt from exp(logp), seeded."""
    generator = torch.Generator().manual_seed(int(seed))
    return torch.multinomial(logp.exp().float(), k, replacement=True, generator=generator)
