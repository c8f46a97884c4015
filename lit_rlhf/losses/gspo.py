"""GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization"): GRPO's group advantages with
one length-normalised importance ratio per sequence, clipped per sequence."""

from __future__ import annotations

import torch
from torch import Tensor

from lit_rlhf.losses.grpo import GRPOLossOutput
from lit_rlhf.ops import kl_penalty, masked_mean


def gspo_policy_loss(
    logps: Tensor,
    old_logps: Tensor | None,
    ref_logps: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    clip_eps_low: float = 3e-4,
    clip_eps_high: float = 4e-4,
    kl_coef: float = 0.0,
    token_weights: Tensor | None = None,
) -> GRPOLossOutput:
    """GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization", Eq. 5-7): one
    length-normalised ratio per sequence, s_i = exp(mean_t (logps - old_logps)) (Eq. 7), clipped
    per sequence (Eq. 5): l_i = -min(s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i), averaged
    over sequences (hence the tiny clip ranges); plus GRPO's k3 KL (each sequence's token mean,
    then the mean) with `kl_coef` > 0. Clip fractions count sequences.

    Args:
        logps: (N, T) per-token log-probs under the current policy.
        old_logps: (N, T) under the sampling policy; None: on-policy (old = logps.detach()).
        ref_logps: (N, T) under the reference; may be None when kl_coef == 0.
        advantages: (N,), one per sequence.
        mask: (N, T) bool, True on completion tokens.
        clip_eps_low: eps_low of the sequence ratio's clip.
        clip_eps_high: eps_high of the sequence ratio's clip.
        kl_coef: weight of the k3 KL to the reference.
        token_weights: (N, T), no gradient: a rollout correction; each l_i is multiplied by the mean of its
            tokens' weights; None = 1.
    """
    if kl_coef != 0.0 and ref_logps is None:
        raise ValueError("ref_logps is required when kl_coef != 0")
    if advantages.shape != logps.shape[:1]:
        raise ValueError(f"advantages must be (N,) = {tuple(logps.shape[:1])}, got {tuple(advantages.shape)}")
    old = logps.detach() if old_logps is None else old_logps.detach()
    zero = logps.new_zeros(())
    log_s = masked_mean(torch.where(mask, logps - old, zero), mask, dim=1)  # (N,)
    s = torch.exp(log_s)
    adv = advantages.detach()
    clipped = torch.clamp(s, 1.0 - clip_eps_low, 1.0 + clip_eps_high)
    per_seq = -torch.minimum(s * adv, clipped * adv)  # (N,)
    if token_weights is not None:
        per_seq = per_seq * masked_mean(token_weights.detach().float(), mask, dim=1)  # (N,)
    policy_loss = per_seq.mean()
    loss = policy_loss
    kl_mean = zero
    if ref_logps is not None:
        kl = kl_penalty(torch.where(mask, logps, zero), torch.where(mask, ref_logps.detach(), zero), "k3")
        kl_mean = masked_mean(kl.detach(), mask)
        if kl_coef != 0.0:
            loss = loss + kl_coef * masked_mean(kl, mask, dim=1).mean()
    s_d = s.detach()
    low = ((s_d < 1.0 - clip_eps_low) & (adv < 0)).float().mean()
    high = ((s_d > 1.0 + clip_eps_high) & (adv > 0)).float().mean()
    return GRPOLossOutput(loss, policy_loss.detach(), kl_mean, low, high, low + high, s_d.mean())
