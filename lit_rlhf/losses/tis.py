"""Truncated importance sampling (TIS) between the sampler and the trainer.

When the responses are sampled by another engine (vLLM), the sampler's probabilities
pi_sampler differ slightly from the trainer's pi_train for the same weights (other kernels,
other precision). The policy-gradient term of each token is then reweighted by

    w_t = min(pi_train(y_t) / pi_sampler(y_t), C) = min(exp(logp_train_t - logp_sampler_t), C)

(Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training",
the truncated importance weight; the truncation C bounds the variance). The weight carries no
gradient.
"""

from __future__ import annotations

import torch
from torch import Tensor


def truncated_importance_weights(train_logps: Tensor, sampler_logps: Tensor, mask: Tensor, cap: float) -> Tensor:
    """Per-token weights (N, T) `min(exp(train_logps - sampler_logps), cap)`, detached; 1 where
    `mask` is False (padding carries no loss anyway).

    train_logps: (N, T) the trainer's log-probs of the sampled tokens (at the sampling
    temperature); sampler_logps: (N, T) the sampler's; mask: (N, T) bool; cap: C > 0.
    """
    if cap <= 0:
        raise ValueError(f"the TIS cap must be > 0, got {cap}")
    if train_logps.shape != sampler_logps.shape or mask.shape != train_logps.shape:
        raise ValueError(f"train_logps {tuple(train_logps.shape)}, sampler_logps {tuple(sampler_logps.shape)} and "
                         f"mask {tuple(mask.shape)} must have the same shape")
    log_ratio = torch.where(mask, train_logps.detach().float() - sampler_logps.detach().float(),
                            torch.zeros((), device=mask.device))
    return torch.exp(log_ratio.clamp(max=torch.log(torch.tensor(float(cap))).item())).masked_fill(~mask, 1.0)
