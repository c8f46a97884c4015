"""REINFORCE leave-one-out (RLOO, Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE
Style Optimization for Learning from Human Feedback in LLMs"; Lambert, "RLHF", RLOO section).

A whole response is one action, rewarded with its score minus the sequence's KL penalty
(`ops.kl_penalized_sequence_rewards`); REINFORCE on the summed sequence log-prob, with the mean
reward of the prompt's other k-1 responses as baseline (`rloo_advantages`, over the whole rollout).
"""

from __future__ import annotations

import torch
from torch import Tensor

from lit_rlhf.ops import groups_of, masked_sum


def rloo_advantages(rewards: Tensor, group_size: int) -> Tensor:
    """REINFORCE leave-one-out advantages (Ahmadian et al. 2024, "Back to Basics").

    A_i = r_i - 1/(G-1) sum_{j != i} r_j = G/(G-1) * (r_i - mean_j r_j). Groups with all-equal
    rewards get exactly 0.

    Args:
        rewards: (B*G,) with each prompt's G completions contiguous; returns (B*G,).
        group_size: G, the completions per prompt, >= 2.
    """
    grouped = groups_of(rewards, group_size)  # (B, G)
    baseline = (grouped.sum(dim=1, keepdim=True) - grouped) / (group_size - 1)
    advantages = grouped - baseline
    all_equal = (grouped == grouped[:, :1]).all(dim=1, keepdim=True)
    return torch.where(all_equal, torch.zeros_like(advantages), advantages).reshape(-1)


def rloo_loss(logps: Tensor, advantages: Tensor, mask: Tensor, token_weights: Tensor | None = None) -> Tensor:
    """-1/n sum_i A_i * sum_t log pi(y_i,t | x, y_i,<t): REINFORCE on the summed sequence log-prob.

    The mean over rows is the mean over prompts of the 1/k sum of Ahmadian et al.'s RLOO
    estimator, as every prompt has k rows; over micro-batches it is exact when each micro-batch
    is weighted by its share of rows.

    Args:
        logps: (n, T) per-token log-probs, with gradient.
        advantages: (n,), no gradient.
        mask: (n, T) bool, the response tokens.
        token_weights: (n, T), no gradient: a rollout correction weighing each token's log-prob; None = 1.
    """
    weighted = logps if token_weights is None else logps * token_weights.detach()
    return -(advantages.detach() * masked_sum(weighted, mask, dim=1)).mean()
