"""REINFORCE++ (Hu et al. 2025, "REINFORCE++: A Simple and Efficient Approach for Aligning Large
Language Models", arXiv 2501.03262): no critic; the k1 KL to the reference is part of the
per-token reward, the per-token returns are normalised over the global batch, and PPO's clipped
surrogate is applied per token."""

from __future__ import annotations

import torch
from torch import Tensor

from lit_rlhf.losses.grpo import GRPOLossOutput, grpo_policy_loss


def reinforce_pp_advantages(
    scores: Tensor,
    mask: Tensor,
    old_logps: Tensor | None = None,
    ref_logps: Tensor | None = None,
    kl_coef: float = 0.0,
    group_size: int | None = None,
) -> Tensor:
    """REINFORCE++ per-token advantages (Hu et al. 2025, arXiv 2501.03262), unnormalised.

    The KL penalty is part of the per-token
    reward, so with gamma = 1 the return of token t is

        A_t = r - kl_coef * sum_{i >= t} KL_i,   KL_i = log pi_old(y_i) - log pi_ref(y_i)  (k1)

    With `group_size` G (REINFORCE++ with baseline), r is first replaced by r - mean of its
    group's G rewards. The result is 0 on masked positions; normalise it over the global batch
    with `normalize_token_advantages`. No critic anywhere.

    Args:
        scores: (N,) outcome rewards.
        mask: (N, T) bool, the response tokens.
        old_logps: (N, T) sampling-time log-probs (needed when kl_coef > 0).
        ref_logps: (N, T) reference log-probs (needed when kl_coef > 0).
        kl_coef: weight of the k1 KL in the per-token reward.
        group_size: G: r becomes r - the mean of its group's G rewards; None: no baseline.
    """
    r = scores.float()
    if group_size is not None:
        if group_size < 2 or r.numel() % group_size:
            raise ValueError(f"group_size must be >= 2 and divide N={r.numel()}, got {group_size}")
        grouped = r.view(-1, group_size)
        r = (grouped - grouped.mean(dim=1, keepdim=True)).reshape(-1)
    adv = r.unsqueeze(1).expand(mask.shape).clone()  # (N, T)
    if kl_coef != 0.0:
        if old_logps is None or ref_logps is None:
            raise ValueError("old_logps and ref_logps are required when kl_coef != 0")
        kl = torch.where(mask, old_logps.float() - ref_logps.float(), torch.zeros((), device=mask.device))
        to_go = kl.flip(1).cumsum(1).flip(1)  # sum_{i >= t} KL_i
        adv = adv - kl_coef * to_go
    return torch.where(mask, adv, torch.zeros_like(adv))


def normalize_token_advantages(advantages: Tensor, mask: Tensor, eps: float = 1e-8) -> Tensor:
    """(A - mean) / (std + eps) over every kept token of the batch (REINFORCE++'s global batch
    normalisation; pass all ranks' rows to make it global). Unbiased std; 0 on masked positions
    and everywhere when all kept values are equal.

    Args:
        advantages: (N, T) per-token advantages.
        mask: (N, T) bool, the kept tokens.
        eps: added to the std before dividing.
    """
    kept = advantages[mask]
    if kept.numel() < 2 or bool((kept == kept[0]).all()):
        return torch.zeros_like(advantages)
    z = (advantages - kept.mean()) / (kept.std() + eps)
    return torch.where(mask, z, torch.zeros_like(z))


def clipped_token_loss(
    logps: Tensor,
    old_logps: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    clip_eps_low: float = 0.2,
    clip_eps_high: float = 0.2,
) -> GRPOLossOutput:
    """PPO's clipped surrogate with one advantage per TOKEN, token mean (REINFORCE++'s loss).

    l_t = -min(ratio_t A_t, clip(ratio_t, 1 - eps_low, 1 + eps_high) A_t), averaged over
    the kept tokens: `grpo_policy_loss` without its KL term (REINFORCE++ puts the KL in the reward).

    Args:
        logps: (N, T) per-token log-probs under the current policy.
        old_logps: (N, T) under the sampling policy; None: on-policy (old = logps.detach()).
        advantages: (N, T), one per token.
        mask: (N, T) bool, the kept tokens.
        clip_eps_low: eps_low of the ratio's clip.
        clip_eps_high: eps_high of the ratio's clip.
    """
    if advantages.shape != logps.shape:
        raise ValueError(f"advantages must be (N, T) = {tuple(logps.shape)}, got {tuple(advantages.shape)}")
    return grpo_policy_loss(logps, old_logps, None, advantages, mask, clip_eps_low, clip_eps_high)
