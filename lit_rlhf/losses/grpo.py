"""Group-relative policy optimisation (DeepSeekMath, Shao et al. 2024): group advantages and the
clipped per-token GRPO loss with the k3 KL inside it."""

from __future__ import annotations

from typing import Literal, NamedTuple

import torch
from torch import Tensor

from lit_rlhf.ops import groups_of, kl_penalty, masked_mean, masked_sum

AdvantageScale = Literal["group", "batch", "none"]
Aggregation = Literal["token_mean", "sequence_mean", "constant_normalizer"]


class GRPOLossOutput(NamedTuple):
    loss: Tensor  # () aggregated per-token loss (surrogate + kl_coef * k3 KL)
    policy_loss: Tensor  # () the clipped-surrogate part alone, same aggregation, detached
    kl: Tensor  # () masked token mean of the k3 KL to the reference (0 without ref_logps), detached
    clipfrac_low: Tensor  # () fraction of tokens clipped at 1 - eps_low (A < 0), detached
    clipfrac_high: Tensor  # () fraction of tokens clipped at 1 + eps_high (A > 0), detached
    clipfrac: Tensor  # () clipfrac_low + clipfrac_high, detached
    ratio_mean: Tensor  # () masked token mean of pi / pi_old, detached


def grpo_advantages(
    rewards: Tensor,
    group_size: int,
    scale: AdvantageScale = "group",
    eps: float = 1e-4,
) -> Tensor:
    """GRPO outcome advantages (DeepSeekMath, Shao et al. 2024, Sec. 4.1.2): (B*G,), each reward
    minus its group's mean, divided by the unbiased std plus eps per `scale`. A group whose
    rewards are all equal gets exactly 0.

    Args:
        rewards: (B*G,) scalar rewards, the G completions of each prompt contiguous.
        group_size: G, the completions per prompt.
        scale: "group" (the group's std, GRPO), "batch" (the std of all B*G rewards: one scale,
            groups whose rewards barely differ are not up-weighted) or "none" (Dr. GRPO, Liu et
            al. 2025: no std, a source of bias).
        eps: added to the std before dividing.
    """
    grouped = groups_of(rewards, group_size)  # (B, G)
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    if scale == "group":
        advantages = centred / (grouped.std(dim=1, keepdim=True) + eps)
    elif scale == "batch":
        advantages = centred / (rewards.std() + eps)
    elif scale == "none":
        advantages = centred
    else:
        raise ValueError(f"unknown scale {scale!r}; expected 'group', 'batch' or 'none'")
    all_equal = (grouped == grouped[:, :1]).all(dim=1, keepdim=True)  # (B, 1)
    return torch.where(all_equal, torch.zeros_like(advantages), advantages).reshape(-1)


def grpo_policy_loss(
    logps: Tensor,
    old_logps: Tensor | None,
    ref_logps: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    clip_eps_low: float = 0.2,
    clip_eps_high: float = 0.2,
    kl_coef: float = 0.0,
    aggregation: Aggregation = "token_mean",
    max_completion_length: int | None = None,
    token_weights: Tensor | None = None,
    token_penalty: Tensor | None = None,
) -> GRPOLossOutput:
    """Clipped GRPO loss with the KL to the reference inside the loss (DeepSeekMath eq. 3).

    Per token, with ratio = exp(logps - old_logps) and A the sequence's advantage:

        l_t = -min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A) + kl_coef * k3_t

    with k3_t = exp(ref - logps) - 1 - (ref - logps), the unbiased non-negative KL estimator
    (DeepSeekMath eq. 4; `ops.kl_penalty(..., "k3")`).

    Args:
        logps: (N, T) per-token log-probs of the N = B*G completions under the current policy.
        old_logps: (N, T) under the sampling policy; None for a single on-policy step (old =
            logps.detach(): the ratio is 1 with the gradient of A * log pi).
        ref_logps: (N, T) under the reference; may be None when kl_coef == 0.
        advantages: (N,), one per completion, broadcast to its tokens; or (N, T), one per token.
        mask: (N, T) bool, True on completion tokens.
        clip_eps_low: eps_low, the lower clip 1 - eps_low of the ratio.
        clip_eps_high: eps_high, the upper clip 1 + eps_high (DAPO's clip-higher when > eps_low).
        kl_coef: the paper's beta, weight of the k3 KL to the reference.
        aggregation: how the (N, T) losses become a scalar: "token_mean" (over all kept tokens,
            DAPO, Yu et al. 2025), "sequence_mean" (over each sequence, then over sequences: GRPO
            eq. 3) or "constant_normalizer" (sum / (N * max_completion_length), Dr. GRPO).
        max_completion_length: the constant normaliser's length; None = T.
        token_weights: (N, T), no gradient: multiplies each token's clipped surrogate (truncated
            importance sampling, `losses.rollout_correction`); None = 1.
        token_penalty: (N, T), with gradient: added to each token's loss before aggregation
            (KL-Cov's |log-ratio| term, `losses.entropy_cov`); None = 0.
    """
    if kl_coef != 0.0 and ref_logps is None:
        raise ValueError("ref_logps is required when kl_coef != 0")
    if advantages.shape not in (logps.shape[:1], logps.shape):
        raise ValueError(f"advantages must be (N,) or (N, T) = {tuple(logps.shape)}, got {tuple(advantages.shape)}")
    old_logps = logps.detach() if old_logps is None else old_logps.detach()
    adv = advantages.detach().unsqueeze(1) if advantages.dim() == 1 else advantages.detach()  # (N, 1) or (N, T)
    # padding positions get log-ratio 0 *before* exp: masking afterwards would still let an
    # overflowing exp turn the zero gradient of torch.where into 0 * inf = NaN
    zero = logps.new_zeros(())
    ratio = torch.exp(torch.where(mask, logps - old_logps, zero))  # (N, T)
    clipped_ratio = torch.clamp(ratio, 1.0 - clip_eps_low, 1.0 + clip_eps_high)
    surrogate = -torch.minimum(ratio * adv, clipped_ratio * adv)  # (N, T)
    if token_weights is not None:
        surrogate = surrogate * token_weights.detach()
    if ref_logps is not None:
        kl = kl_penalty(torch.where(mask, logps, zero), torch.where(mask, ref_logps.detach(), zero), "k3")  # (N, T)
        per_token = surrogate + kl_coef * kl if kl_coef != 0.0 else surrogate
        kl_mean = masked_mean(kl.detach(), mask)
    else:
        per_token = surrogate
        kl_mean = logps.new_zeros(())
    if token_penalty is not None:
        per_token = per_token + token_penalty

    def aggregate(values: Tensor) -> Tensor:
        if aggregation == "token_mean":
            return masked_mean(values, mask)
        if aggregation == "sequence_mean":
            return masked_mean(values, mask, dim=1).mean()
        if aggregation == "constant_normalizer":
            length = mask.shape[1] if max_completion_length is None else max_completion_length
            return masked_sum(values, mask) / (mask.shape[0] * length)
        raise ValueError(
            f"unknown aggregation {aggregation!r}; expected 'token_mean', 'sequence_mean' or 'constant_normalizer'"
        )

    ratio_d = ratio.detach()
    low = masked_mean(((ratio_d < 1.0 - clip_eps_low) & (adv < 0)).float(), mask)
    high = masked_mean(((ratio_d > 1.0 + clip_eps_high) & (adv > 0)).float(), mask)
    return GRPOLossOutput(
        loss=aggregate(per_token),
        policy_loss=aggregate(surrogate.detach()),
        kl=kl_mean,
        clipfrac_low=low,
        clipfrac_high=high,
        clipfrac=low + high,
        ratio_mean=masked_mean(ratio_d, mask),
    )
