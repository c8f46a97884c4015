"""ReMax's advantage (Li et al. 2023, "ReMax: A Simple, Effective, and Efficient Reinforcement
Learning Method for Large Language Models", Sec. 4.1 and Algorithm 1).

REINFORCE on whole responses (`rloo_loss`) with the reward of the policy's greedy response to the
same prompt as baseline: no value model, one extra greedy decode per prompt.
"""

from __future__ import annotations

from torch import Tensor


def remax_advantages(rewards: Tensor, greedy_rewards: Tensor) -> Tensor:
    """A_i = r(x_i, y_i) - r(x_i, y_greedy_i) (Li et al. 2023, Algorithm 1, line 6). Returns (N,), without gradient.

    Args:
        rewards: (N,) the sampled responses' rewards.
        greedy_rewards: (N,) the reward of the greedy response to each row's prompt (a prompt's rows share
            it).
    """
    if rewards.shape != greedy_rewards.shape:
        raise ValueError(f"rewards {tuple(rewards.shape)} and greedy_rewards {tuple(greedy_rewards.shape)} differ in shape")
    return rewards.detach().float() - greedy_rewards.detach().float()
