"""Clip-Cov and KL-Cov (Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for
Reasoning Language Models", arXiv 2505.22617): entropy control through the few tokens whose
centred covariance Cov_t = (log pi(y_t) - mean log pi) * (A_t - mean A) is highest, explained in
`docs/methods/grpo.md`. Defaults are the authors' code's (r = 2e-4, band (1, 5), beta = 1).
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import torch
from torch import Tensor

from lit_rlhf.ops import masked_mean

CLIP_COV_RATIO, CLIP_COV_LOWER, CLIP_COV_UPPER = 2e-4, 1.0, 5.0
KL_COV_RATIO, KL_COV_COEF = 2e-4, 1.0


def token_covariance(logps: Tensor, advantages: Tensor, mask: Tensor) -> Tensor:
    """(N, T) Cov_t = (logp_t - mean logp) * (A_t - mean A) over the mask's tokens, detached
    float32, 0 off the mask.

    Args:
        logps: (N, T) log-probs of the sampled tokens.
        advantages: (N,) one per row, or (N, T) one per token.
        mask: (N, T) bool, the tokens the means run over.
    """
    adv = advantages.detach().float()
    adv = adv.unsqueeze(1).expand_as(logps) if adv.dim() == 1 else adv  # (N, T)
    lp = logps.detach().float()
    cov = (lp - masked_mean(lp, mask)) * (adv - masked_mean(adv, mask))
    return torch.where(mask, cov, torch.zeros((), device=mask.device))


def selection_size(mask: Tensor, ratio: float) -> int:
    """max(1, floor(ratio * valid tokens)): how many tokens a control acts on."""
    if not 0 < ratio <= 1:
        raise ValueError(f"the covariance controls' ratio must be in (0, 1], got {ratio}")
    return max(1, int(ratio * int(mask.sum())))


def clip_cov_keep(cov: Tensor, mask: Tensor, ratio: float = CLIP_COV_RATIO, lower: float = CLIP_COV_LOWER,
                  upper: float = CLIP_COV_UPPER, exclude: Tensor | None = None,
                  generator: torch.Generator | None = None) -> Tensor:
    """Clip-Cov's keep-mask (N, T) bool: the mask without max(1, floor(ratio * N)) tokens drawn
    uniformly (`generator`) among those with lower < cov < upper and not in `exclude` (N, T)
    bool (the tokens the PPO clip already cut); all candidates when there are fewer.

    Args:
        cov: (N, T) the tokens' covariances (`token_covariance`).
        mask: (N, T) bool, the policy's tokens.
        ratio: the fraction of N rows' worth of tokens to drop.
        lower: candidates have cov > lower.
        upper: candidates have cov < upper.
        exclude: (N, T) bool, tokens never drawn (those the PPO clip already cut), or None.
        generator: the random generator of the draw, or None.
    """
    if not lower < upper:
        raise ValueError(f"Clip-Cov needs lower < upper, got {lower} and {upper}")
    candidates = mask & (cov > lower) & (cov < upper)
    if exclude is not None:
        candidates = candidates & ~exclude
    flat = candidates.flatten().nonzero().squeeze(1)  # (C,)
    k = min(selection_size(mask, ratio), flat.numel())
    keep = mask.clone()
    if k:
        order = torch.randperm(flat.numel(), generator=generator, device="cpu").to(flat.device)
        keep.view(-1)[flat[order[:k]]] = False
    return keep


def kl_cov_selected(cov: Tensor, mask: Tensor, ratio: float = KL_COV_RATIO) -> Tensor:
    """KL-Cov's tokens (N, T) bool: the max(1, floor(ratio * N)) of largest covariance.

    Args:
        cov: (N, T) the tokens' covariances (`token_covariance`).
        mask: (N, T) bool, the candidate tokens.
        ratio: the fraction of N rows' worth of tokens selected.
    """
    k = selection_size(mask, ratio)
    scores = cov.float().masked_fill(~mask, float("-inf")).flatten()
    selected = torch.zeros_like(scores, dtype=torch.bool)
    if mask.any():
        selected[torch.topk(scores, min(k, int(mask.sum()))).indices] = True
    return selected.view_as(mask)


def kl_cov_penalty(logps: Tensor, old_logps: Tensor, selected: Tensor, coef: float = KL_COV_COEF) -> Tensor:
    """(N, T) KL-Cov's per-token term coef * |logps - old_logps| on the `selected` tokens, 0
    elsewhere, with the gradient of `logps` (added to the policy loss before aggregation).

    Args:
        logps: (N, T) the current log-probs, with gradient.
        old_logps: (N, T) the sampling-time log-probs.
        selected: (N, T) bool, the tokens penalised (`kl_cov_selected`).
        coef: the penalty's weight.
    """
    return torch.where(selected, coef * (logps - old_logps.detach()).abs(), logps.new_zeros(()))


@dataclasses.dataclass(frozen=True)
class CovarianceControl:
    """Clip-Cov or KL-Cov as an option of a clipped per-token policy loss (GRPO's).

    Args:
        method: `clip_cov` (detach the gradient of tokens drawn in the covariance band) or
            `kl_cov` (penalise the tokens of largest covariance).
        ratio: r, the fraction of the valid tokens acted on (2e-4).
        lower: the lower end of Clip-Cov's covariance band (1).
        upper: the upper end of Clip-Cov's covariance band (5).
        kl_coef: KL-Cov's beta (1).
    """

    method: Literal["clip_cov", "kl_cov"] = "clip_cov"
    ratio: float = CLIP_COV_RATIO
    lower: float = CLIP_COV_LOWER
    upper: float = CLIP_COV_UPPER
    kl_coef: float = KL_COV_COEF

    def __post_init__(self) -> None:
        if self.method not in ("clip_cov", "kl_cov"):
            raise ValueError(f"the covariance control's method must be 'clip_cov' or 'kl_cov', got {self.method!r}")
        if not 0 < self.ratio <= 1 or not self.lower < self.upper or not self.kl_coef >= 0:
            raise ValueError(f"the covariance control needs 0 < ratio <= 1, lower < upper and kl_coef >= 0: {self}")

    def apply(self, logps: Tensor, old_logps: Tensor | None, advantages: Tensor, mask: Tensor,
              clip_eps_low: float, clip_eps_high: float) -> tuple[Tensor | None, Tensor | None]:
        """(token weights (N, T) or None, token penalty (N, T) or None) for a micro-batch: Clip-Cov's
        keep-mask as 0/1 weights (its candidates exclude the tokens the PPO clip already cut),
        KL-Cov's penalty with gradient. The covariance is the micro-batch's."""
        old = logps.detach() if old_logps is None else old_logps.detach()
        cov = token_covariance(logps, advantages, mask)
        if self.method == "kl_cov":
            return None, kl_cov_penalty(logps, old, kl_cov_selected(cov, mask, self.ratio), self.kl_coef)
        adv = advantages.detach().float()
        adv = adv.unsqueeze(1) if adv.dim() == 1 else adv
        ratio = torch.exp(torch.where(mask, logps.detach().float() - old.float(), torch.zeros((), device=mask.device)))
        clipped = mask & (-adv * ratio.clamp(1 - clip_eps_low, 1 + clip_eps_high) > -adv * ratio)
        keep = clip_cov_keep(cov, mask, self.ratio, self.lower, self.upper, exclude=clipped)
        return keep.float(), None
