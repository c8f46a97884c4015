"""REINFORCE leave-one-out (RLOO, Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE
Style Optimization for Learning from Human Feedback in LLMs"; Lambert, "RLHF", RLOO section).

A whole response is one action: its reward is the reward model's score minus the KL penalty
`beta * log(pi(y|x) / pi_ref(y|x))` of the whole sequence, and the gradient is REINFORCE on the
SUMMED sequence log-prob with the mean reward of the prompt's other k-1 responses as baseline.
"""

from __future__ import annotations

from typing import NamedTuple

from torch import Tensor

from lit_rlhf.losses.grpo import rloo_advantages
from lit_rlhf.ops import masked_sum


class RLOOLossOutput(NamedTuple):
    loss: Tensor  # () -mean_i(A_i * log pi(y_i|x))
    rewards: Tensor  # (N,) sequence rewards: score - beta * KL, detached
    advantages: Tensor  # (N,) leave-one-out advantages of the rewards, detached
    kl: Tensor  # (N,) sequence KL log pi(y|x) - log pi_ref(y|x) of the sampling policy, detached


def rloo_sequence_rewards(scores: Tensor, old_logps: Tensor, ref_logps: Tensor | None, mask: Tensor,
                          beta: float) -> tuple[Tensor, Tensor]:
    """KL-penalised sequence rewards r_i = score_i - beta * sum_t (log pi_old - log pi_ref)(y_i,t).

    scores: (N,); old_logps, ref_logps: (N, T) per-token log-probs of the sampled tokens under the
    sampling policy and the reference (ref_logps may be None when beta == 0); mask: (N, T) bool.
    Returns (rewards (N,), kl (N,)), both without gradient.
    """
    if ref_logps is None:
        if beta != 0.0:
            raise ValueError("ref_logps is required when beta != 0")
        kl = scores.new_zeros(scores.shape)
    else:
        kl = masked_sum(old_logps.detach().float() - ref_logps.detach().float(), mask, dim=1)  # (N,)
    return (scores.detach().float() - beta * kl), kl


def rloo_loss(logps: Tensor, advantages: Tensor, mask: Tensor) -> Tensor:
    """-1/n sum_i A_i * sum_t log pi(y_i,t | x, y_i,<t): REINFORCE on the summed sequence log-prob.

    logps: (n, T) per-token log-probs with gradient; advantages: (n,) (no gradient); mask: (n, T).
    The mean over rows is the mean over prompts of the 1/k sum of Ahmadian et al.'s RLOO
    estimator, as every prompt has k rows; over micro-batches it is exact when each micro-batch
    is weighted by its share of rows.
    """
    return -(advantages.detach() * masked_sum(logps, mask, dim=1)).mean()


def rloo(logps: Tensor, old_logps: Tensor, ref_logps: Tensor | None, scores: Tensor, mask: Tensor,
         group_size: int, beta: float) -> RLOOLossOutput:
    """The whole RLOO objective of N = B*k responses (each prompt's k responses contiguous).

    r_i = score_i - beta * KL_i (`rloo_sequence_rewards`), A_i = r_i - mean_{j != i} r_j over the
    prompt's other responses (`rloo_advantages`), loss = -mean_i(A_i * log pi(y_i|x)) (`rloo_loss`).
    """
    rewards, kl = rloo_sequence_rewards(scores, old_logps, ref_logps, mask, beta)
    advantages = rloo_advantages(rewards, group_size)
    return RLOOLossOutput(rloo_loss(logps, advantages, mask), rewards, advantages, kl)
