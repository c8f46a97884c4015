"""GRPO-family variants: DAPO's group filter, GSPO's sequence-level ratio, REINFORCE++ advantages.

Pure functions on tensors; `GRPOModule` selects them with `dynamic_sampling`,
`mask_truncated`, `importance_sampling: sequence` and `advantage: reinforce_pp |
reinforce_pp_baseline`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lit_rlhf.losses.grpo import GRPOLossOutput
from lit_rlhf.ops import kl_penalty, masked_mean


def informative_groups(scores: Tensor, group_size: int) -> Tensor:
    """DAPO's dynamic-sampling constraint (Yu et al. 2025, Eq. 11: 0 < |{o_i correct}| < G),
    generalised to any reward: True for each group whose G scores are not all equal.

    scores: (B*G,), each prompt's G completions contiguous -> (B,) bool.
    """
    if scores.dim() != 1 or group_size < 2 or scores.numel() % group_size:
        raise ValueError(f"scores must be flat (B*G,) with G = group_size >= 2 dividing it; "
                         f"got shape {tuple(scores.shape)} and group_size {group_size}")
    grouped = scores.view(-1, group_size)
    return ~(grouped == grouped[:, :1]).all(dim=1)


def clipped_token_loss(
    logps: Tensor,
    old_logps: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    clip_eps_low: float = 0.2,
    clip_eps_high: float = 0.2,
) -> GRPOLossOutput:
    """PPO's clipped surrogate with one advantage per TOKEN, token mean (REINFORCE++'s loss).

    logps, old_logps (None: on-policy, old = logps.detach()), advantages: (N, T); mask: (N, T)
    bool. l_t = -min(ratio_t A_t, clip(ratio_t, 1 - eps_low, 1 + eps_high) A_t), averaged over
    the kept tokens. No KL term: REINFORCE++ puts the KL in the reward.
    """
    if advantages.shape != logps.shape:
        raise ValueError(f"advantages must be (N, T) = {tuple(logps.shape)}, got {tuple(advantages.shape)}")
    old = logps.detach() if old_logps is None else old_logps.detach()
    adv = advantages.detach()
    ratio = torch.exp(torch.where(mask, logps - old, logps.new_zeros(())))
    clipped = torch.clamp(ratio, 1.0 - clip_eps_low, 1.0 + clip_eps_high)
    surrogate = -torch.minimum(ratio * adv, clipped * adv)
    loss = masked_mean(surrogate, mask)
    r = ratio.detach()
    low = masked_mean(((r < 1.0 - clip_eps_low) & (adv < 0)).float(), mask)
    high = masked_mean(((r > 1.0 + clip_eps_high) & (adv > 0)).float(), mask)
    return GRPOLossOutput(loss, loss.detach(), logps.new_zeros(()), low, high, low + high, masked_mean(r, mask))


def gspo_policy_loss(
    logps: Tensor,
    old_logps: Tensor | None,
    ref_logps: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    clip_eps_low: float = 3e-4,
    clip_eps_high: float = 4e-4,
    kl_coef: float = 0.0,
) -> GRPOLossOutput:
    """GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization", Eq. 5-7).

    logps, old_logps (None: on-policy), ref_logps: (N, T); advantages: (N,); mask: (N, T) bool.
    The importance ratio is per SEQUENCE and length-normalised (Eq. 7):

        s_i = (pi(y_i|x) / pi_old(y_i|x)) ^ (1/|y_i|) = exp( mean_t (logps - old_logps) )

    and clipped per sequence (Eq. 5): l_i = -min(s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i),
    averaged over the N sequences. The paper's clip ranges are tiny (3e-4 / 4e-4) because s_i is
    a geometric mean. With `kl_coef` > 0 the k3 KL to the reference (token mean of each sequence,
    then mean over sequences) is added, as in GRPO. Clip fractions count sequences.
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


def reinforce_pp_advantages(
    scores: Tensor,
    mask: Tensor,
    old_logps: Tensor | None = None,
    ref_logps: Tensor | None = None,
    kl_coef: float = 0.0,
    group_size: int | None = None,
) -> Tensor:
    """REINFORCE++ per-token advantages (Hu et al. 2025, arXiv 2501.03262), unnormalised.

    scores: (N,) outcome rewards; mask: (N, T) bool; old_logps / ref_logps: (N, T) sampling-time
    and reference log-probs (needed when kl_coef > 0). The KL penalty is part of the per-token
    reward, so with gamma = 1 the return of token t is

        A_t = r - kl_coef * sum_{i >= t} KL_i,   KL_i = log pi_old(y_i) - log pi_ref(y_i)  (k1)

    With `group_size` G (REINFORCE++ with baseline), r is first replaced by r - mean of its
    group's G rewards. The result is 0 on masked positions; normalise it over the global batch
    with `normalize_token_advantages`. No critic anywhere.
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
    and everywhere when all kept values are equal."""
    kept = advantages[mask]
    if kept.numel() < 2 or bool((kept == kept[0]).all()):
        return torch.zeros_like(advantages)
    z = (advantages - kept.mean()) / (kept.std() + eps)
    return torch.where(mask, z, torch.zeros_like(z))
