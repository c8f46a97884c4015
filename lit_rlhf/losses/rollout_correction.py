"""Rollout correction: importance weights and a keep-mask between the sampling engine (vLLM, an
older policy) and the trainer; the settings are explained in `docs/guides/vllm.md`.

With l_t = log pi_train(y_t) - log pi_sampler(y_t), the ratio w is exp(l_t) per `token`, exp(sum_t
l_t) per `sequence`, or exp(mean_t l_t), `geometric` (GSPO's, Zheng et al. 2025, Eq. 7). Mode
`truncate`: weights min(w, upper), every token kept (truncated importance sampling, Yao et al.
2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training"); `mask`: weights w,
tokens or sequences with w outside [lower, upper] dropped (IcePop, Ling Team 2025, "Every Step
Evolves"; TRL's `sequence_mask`). DeepSeek-V3.2's off-policy sequence mask (DeepSeek-AI 2025)
also drops a row with A_i < 0 whose KL_i = mean_t (log pi_sampler - log pi_train) exceeds delta.
Weights and keep-mask are separate (as verl's); a loss applies weights * keep. No gradient here.
"""

from __future__ import annotations

import math
from typing import Literal, NamedTuple

import torch
from torch import Tensor

from lit_rlhf.ops import masked_mean

Level = Literal["token", "sequence", "geometric"]
Mode = Literal["truncate", "mask"]
LEVELS = ("token", "sequence", "geometric")
MODES = ("truncate", "mask")
MAX_LOG_RATIO = 80.0
"""Log-ratios are clamped to +-80 before exp (float32's exp overflows near 88)."""


class CorrectionOutput(NamedTuple):
    """weights (N, T) float32, >= 0, 1 off the mask; keep (N, T) bool, True where a token stays
    in the policy-gradient term (False off the mask). Both detached."""

    weights: Tensor
    keep: Tensor

    def factor(self) -> Tensor:
        """(N, T) weights * keep: what multiplies each token's policy-gradient term."""
        return self.weights.masked_fill(~self.keep, 0.0)


class MismatchStats(NamedTuple):
    """Detached scalars over the mask's tokens (`mismatch_stats`)."""

    kl_k1: Tensor
    kl_k3: Tensor
    ratio_mean: Tensor
    ratio_min: Tensor
    ratio_max: Tensor
    ratio_p05: Tensor
    ratio_p50: Tensor
    ratio_p95: Tensor
    masked_fraction: Tensor
    weight_mean: Tensor


def check_bounds(mode: str, level: str, lower: float | None, upper: float | None,
                 offpolicy_kl: float | None = None) -> None:
    """Raise ValueError unless (mode, level, lower, upper, offpolicy_kl) is a valid correction."""
    if mode not in MODES:
        raise ValueError(f"rollout correction mode must be one of {MODES}, got {mode!r}")
    if level not in LEVELS:
        raise ValueError(f"rollout correction level must be one of {LEVELS}, got {level!r}")
    if upper is None or not upper > 0:
        raise ValueError(f"rollout correction upper must be > 0, got {upper}")
    if mode == "truncate" and lower is not None:
        raise ValueError("rollout correction lower is a mask bound: truncate caps at upper only (lower: null)")
    if lower is not None and not 0 <= lower < upper:
        raise ValueError(f"rollout correction bounds need 0 <= lower < upper, got lower {lower}, upper {upper}")
    if offpolicy_kl is not None and not offpolicy_kl >= 0:
        raise ValueError(f"the off-policy sequence mask's KL threshold must be >= 0, got {offpolicy_kl}")


def log_ratios(train_logps: Tensor, sampler_logps: Tensor, mask: Tensor, level: Level = "token") -> Tensor:
    """The log importance ratio log(pi_train / pi_sampler) (detached, float32), broadcast to
    (N, T): per token (`token`), the row's sum (`sequence`) or mean (`geometric`) on each of its
    tokens; 0 off the mask."""
    if train_logps.shape != sampler_logps.shape or mask.shape != train_logps.shape:
        raise ValueError(f"train_logps {tuple(train_logps.shape)}, sampler_logps {tuple(sampler_logps.shape)} and "
                         f"mask {tuple(mask.shape)} must have the same shape")
    zero = torch.zeros((), device=mask.device)
    per_token = torch.where(mask, train_logps.detach().float() - sampler_logps.detach().float(), zero)  # (N, T)
    if level == "token":
        return per_token
    if level == "sequence":
        per_row = per_token.sum(dim=1, keepdim=True)  # (N, 1)
    elif level == "geometric":
        per_row = per_token.sum(dim=1, keepdim=True) / mask.sum(dim=1, keepdim=True).clamp(min=1)
    else:
        raise ValueError(f"rollout correction level must be one of {LEVELS}, got {level!r}")
    return torch.where(mask, per_row.expand_as(per_token), zero)


def offpolicy_sequence_keep(train_logps: Tensor, sampler_logps: Tensor, mask: Tensor, advantages: Tensor,
                            threshold: float) -> Tensor:
    """DeepSeek-V3.2's off-policy sequence mask (N, T) bool: False on the tokens of a row whose
    KL_i = mean_t (sampler_logps - train_logps) exceeds `threshold` where its advantage is < 0
    (advantages (N,), or (N, T) per token: then a token with A_t < 0 in such a row); True
    elsewhere on the mask, False off it."""
    kl = -log_ratios(train_logps, sampler_logps, mask, "geometric")  # (N, T): the row's mean of l_sampler - l_train
    adv = advantages.detach()
    negative = (adv < 0).unsqueeze(1) if adv.dim() == 1 else adv < 0  # (N, 1) or (N, T)
    return mask & ~(negative & (kl > threshold))


def rollout_correction(train_logps: Tensor, sampler_logps: Tensor, mask: Tensor, mode: Mode = "truncate",
                       level: Level = "token", upper: float = 2.0, lower: float | None = None,
                       advantages: Tensor | None = None, offpolicy_kl: float | None = None) -> CorrectionOutput:
    """Importance weights and a keep-mask of the sampled tokens (the module docstring's equations).

    Args:
        train_logps: (N, T) the trainer's log-probs of the sampled tokens (at the sampling temperature).
        sampler_logps: (N, T) the sampler's log-probs of the same tokens.
        mask: (N, T) bool, the policy's tokens.
        mode: `truncate` (weights min(w, upper), all kept) or `mask` (weights w, kept where lower <= w <=
            upper).
        level: `token`, `sequence` or `geometric`.
        upper: the cap (truncate) or upper bound (mask) of the weights.
        lower: `mask`'s lower bound; None = 1 / upper.
        advantages: (N,) or (N, T), needed only with `offpolicy_kl`.
        offpolicy_kl: the KL threshold delta of DeepSeek-V3.2's off-policy sequence mask; None: off.
    """
    check_bounds(mode, level, lower, upper, offpolicy_kl)
    log_w = log_ratios(train_logps, sampler_logps, mask, level).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)  # (N, T)
    if mode == "truncate":
        weights, keep = torch.exp(log_w.clamp(max=math.log(upper))), mask.clone()
    else:
        low = 1.0 / upper if lower is None else lower
        weights = torch.exp(log_w)
        # compared in log space where possible, so w exactly at a bound stays in
        keep = mask & (log_w <= math.log(upper)) & ((log_w >= math.log(low)) if low > 0 else True)
    if offpolicy_kl is not None:
        if advantages is None:
            raise ValueError("the off-policy sequence mask (offpolicy_kl) needs the advantages")
        keep = keep & offpolicy_sequence_keep(train_logps, sampler_logps, mask, advantages, offpolicy_kl)
    return CorrectionOutput(weights.masked_fill(~mask, 1.0), keep)


def truncated_importance_weights(train_logps: Tensor, sampler_logps: Tensor, mask: Tensor, cap: float) -> Tensor:
    """Per-token weights (N, T) `min(exp(train_logps - sampler_logps), cap)`, detached; 1 where
    `mask` is False: `rollout_correction` at the token level in `truncate` mode (cap = upper).

    Args:
        train_logps: (N, T) the trainer's log-probs of the sampled tokens.
        sampler_logps: (N, T) the sampler's log-probs of the same tokens.
        mask: (N, T) bool, the policy's tokens.
        cap: the weights' upper bound C.
    """
    if cap <= 0:
        raise ValueError(f"the TIS cap must be > 0, got {cap}")
    return rollout_correction(train_logps, sampler_logps, mask, "truncate", "token", upper=cap).weights


def sorted_quantiles(values: Tensor, qs: tuple[float, ...]) -> Tensor:
    """Quantiles of a 1-D tensor, linearly interpolated as `torch.quantile` does, without its
    size limit (2^24 elements: a large rollout's tokens exceed it)."""
    ordered = values.float().sort().values  # (M,)
    positions = torch.tensor(qs, device=values.device) * (ordered.numel() - 1)
    low = positions.floor().long()
    high = positions.ceil().long()
    return ordered[low] + (positions - low) * (ordered[high] - ordered[low])


def mismatch_stats(train_logps: Tensor, sampler_logps: Tensor, mask: Tensor,
                   correction: CorrectionOutput | None = None) -> MismatchStats:
    """How far the sampler's log-probs are from the trainer's, over the mask's tokens (detached).

    With r_t = pi_train(y_t) / pi_sampler(y_t) on tokens sampled from pi_sampler, KL(sampler ||
    train) is estimated by k1 = mean_t(-log r_t) (unbiased, may be negative) and k3 = mean_t(r_t -
    1 - log r_t) (unbiased, >= 0; Schulman 2020, "Approximating KL Divergence"). The token ratios'
    mean, min, max and 5/50/95% quantiles; with a `correction`, the fraction of the mask's tokens
    it drops and the mean of its weights over the kept ones (else 0 and 1).

    Args:
        train_logps: (N, T) the trainer's log-probs of the sampled tokens.
        sampler_logps: (N, T) the sampler's log-probs of the same tokens.
        mask: (N, T) bool, the tokens measured.
        correction: the `rollout_correction` applied, or None.
    """
    log_r = log_ratios(train_logps, sampler_logps, mask, "token").clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)  # (N, T)
    ratio = torch.exp(log_r)
    k3 = ratio - 1.0 - log_r
    tokens = ratio[mask]  # (M,)
    if tokens.numel() == 0:
        tokens = torch.ones(1, device=mask.device)
    quantiles = sorted_quantiles(tokens, (0.05, 0.5, 0.95))
    if correction is None:
        masked, weight_mean = torch.zeros((), device=mask.device), torch.ones((), device=mask.device)
    else:
        masked = masked_mean((~correction.keep).float(), mask)
        weight_mean = masked_mean(correction.weights.float(), correction.keep & mask)
    return MismatchStats(masked_mean(-log_r, mask), masked_mean(k3, mask), tokens.mean(), tokens.min(), tokens.max(),
                         quantiles[0], quantiles[1], quantiles[2], masked, weight_mean)
