"""PPO for RLHF: clipped policy loss, clipped value loss, KL-shaped per-token rewards.

Follows "The N+ Implementation Details of RLHF with PPO" (Huang et al. 2024) and its cleanrl-style
reference code (summarize_from_feedback_details). All tensors are per response token, (B, R),
with `mask` True on the response tokens (up to and including the first EOS, D23).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from lit_rlhf.ops import kl_penalty, masked_mean, masked_var, place_rewards
from lit_rlhf.ops.rl import KLEstimator


class PPOPolicyLossOutput(NamedTuple):
    loss: Tensor  # () masked token mean of max(-A * ratio, -A * clip(ratio))
    clipfrac: Tensor  # () fraction of tokens where the clipped term is the larger loss, detached
    approxkl: Tensor  # () masked mean of 0.5 * (log ratio)^2, detached
    ratio_mean: Tensor  # () masked mean of pi / pi_old, detached
    ratio_var: Tensor  # () masked (biased) variance of pi / pi_old, detached


class PPOValueLossOutput(NamedTuple):
    loss: Tensor  # () 0.5 * masked mean of max(unclipped sq. error, clipped sq. error)
    clipfrac: Tensor  # () fraction of tokens where the clipped error is the larger, detached
    vpred: Tensor  # () masked mean of the predicted values, detached
    error: Tensor  # () masked mean of the unclipped squared error (values - returns)^2, detached


class PPORewardsOutput(NamedTuple):
    rewards: Tensor  # (B, R) -kl_coef * kl_t, plus the score at the last response token; 0 off mask
    kl: Tensor  # (B, R) per-token KL estimate, 0 off mask, detached


def ppo_policy_loss(
    logps: Tensor,
    old_logps: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_eps: float = 0.2,
) -> PPOPolicyLossOutput:
    """PPO-Clip policy loss (Schulman et al. 2017, eq. 7, negated), token mean over `mask`.

    With ratio = exp(logps - old_logps):

        loss = masked_mean(max(-A * ratio, -A * clip(ratio, 1 - eps, 1 + eps)))

    On the first minibatch of a rollout (D7: no dropout) ratio == 1 exactly and the loss is
    -masked_mean(A). `approxkl` is the N+ code's 0.5 * mean(log ratio^2) (the k2 estimator).

    Args:
        logps: (B, R) log-probs of the sampled tokens under the current policy (with grad).
        old_logps: (B, R) the same under the policy that sampled them (no grad).
        advantages: (B, R), whitened upstream (D25).
        mask: (B, R) bool, the response tokens.
        clip_eps: eps of the ratio's clip.
    """
    old_logps = old_logps.detach()
    advantages = advantages.detach()
    # log-ratio 0 on padding before exp, so garbage there cannot overflow into NaN gradients
    logratio = torch.where(mask, logps - old_logps, logps.new_zeros(()))  # (B, R)
    ratio = torch.exp(logratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps)
    loss = masked_mean(torch.maximum(unclipped, clipped), mask)
    ratio_d = ratio.detach()
    return PPOPolicyLossOutput(
        loss=loss,
        clipfrac=masked_mean((clipped > unclipped).float().detach(), mask),
        approxkl=masked_mean(0.5 * logratio.detach() ** 2, mask),
        ratio_mean=masked_mean(ratio_d, mask),
        ratio_var=masked_var(ratio_d, mask, unbiased=False),
    )


def ppo_value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    clip_eps: float = 0.2,
) -> PPOValueLossOutput:
    """Clipped value loss of the N+ code / cleanrl (`clip_vloss`), token mean over `mask`.

    With v_clip = old_values + clip(values - old_values, -eps, +eps):

        loss = 0.5 * masked_mean(max((values - returns)^2, (v_clip - returns)^2))

    Args:
        values: (B, R) current predictions (with grad).
        old_values: (B, R) predictions at rollout time.
        returns: (B, R) GAE returns (advantages + old values).
        mask: (B, R) bool, the response tokens.
        clip_eps: eps of the value clip.
    """
    old_values = old_values.detach()
    returns = returns.detach()
    clipped_values = old_values + torch.clamp(values - old_values, -clip_eps, clip_eps)
    unclipped_sq = (values - returns) ** 2
    clipped_sq = (clipped_values - returns) ** 2
    loss = 0.5 * masked_mean(torch.maximum(unclipped_sq, clipped_sq), mask)
    return PPOValueLossOutput(
        loss=loss,
        clipfrac=masked_mean((clipped_sq > unclipped_sq).float().detach(), mask),
        vpred=masked_mean(values.detach(), mask),
        error=masked_mean(unclipped_sq.detach(), mask),
    )


def ppo_rewards(
    scores: Tensor,
    logps: Tensor,
    ref_logps: Tensor,
    mask: Tensor,
    kl_coef: float,
    estimator: KLEstimator = "k1",
    turn_rewards: Tensor | None = None,
) -> PPORewardsOutput:
    """Per-token RLHF rewards (N+): a KL penalty on every response token, the score on the last
    one (the EOS, D12: the last True of `mask`):

        rewards[b, t] = -kl_coef * kl_penalty(logps, ref_logps)[b, t] + (t == last of b) * scores[b]

    A multi-turn episode's `turn_rewards` stay where they are and the rest of the score goes on
    the last token (`ops.place_rewards`).

    Args:
        scores: (B,) reward-model scores (after the D23 EOS trick).
        logps: (B, R) log-probs of the sampled tokens under the rollout policy.
        ref_logps: (B, R) the same under the reference.
        mask: (B, R) bool, each row with at least one True.
        kl_coef: weight of the per-token KL penalty.
        estimator: the KL estimator of `ops.kl_penalty` (k1 = log pi - log pi_ref, the N+ choice).
        turn_rewards: (B, R) a multi-turn episode's turn rewards, each on its turn's last policy
            token, or None.
    """
    zero = logps.new_zeros(())
    kl = torch.where(mask, kl_penalty(logps.detach(), ref_logps.detach(), estimator), zero)  # (B, R)
    rewards = -kl_coef * kl + place_rewards(scores.detach().to(kl.dtype), mask, turn_rewards)
    return PPORewardsOutput(rewards=rewards, kl=kl)
