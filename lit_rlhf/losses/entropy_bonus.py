"""An entropy bonus from the sampled tokens (`docs/methods/grpo.md`): the per-token term
b_t = alpha * stopgrad(log pi(y_t)) * log pi(y_t) has the score-function gradient of -alpha * H(pi)
(grad H = -E[log pi(y) grad log pi(y)]), without the full distribution's logits. The adaptive
coefficient is Skywork-OR1's (He et al. 2025): alpha <- clip(alpha + delta * sign(H_target - H),
alpha_min, alpha_max) after each rollout.
"""

from __future__ import annotations

import dataclasses
import math

import torch
from torch import Tensor

from lit_rlhf.ops import masked_mean


def entropy_bonus_penalty(logps: Tensor, mask: Tensor, coef: float) -> Tensor:
    """(N, T) per-token term coef * stopgrad(logps) * logps on the mask (0 off it), with the
    gradient of `logps`: added to the per-token loss, it is -coef times the entropy's gradient.

    Args:
        logps: (N, T) log-probs of the sampled tokens, with gradient.
        mask: (N, T) bool, the tokens in the term.
        coef: the entropy bonus's weight.
    """
    return torch.where(mask, coef * logps.detach() * logps, logps.new_zeros(()))


def sampled_entropy(logps: Tensor, mask: Tensor) -> Tensor:
    """The token entropy's estimate mean_t(-log pi(y_t)) over the mask, detached.

    Args:
        logps: (N, T) log-probs of the sampled tokens.
        mask: (N, T) bool, the tokens averaged over.
    """
    return masked_mean(-logps.detach().float(), mask)


def adaptive_entropy_coef(coef: float, entropy: float, target: float, step: float, lower: float,
                          upper: float) -> float:
    """alpha + step * sign(target - entropy), clipped to [lower, upper] (unchanged at the target).

    Args:
        coef: the current coefficient alpha.
        entropy: the measured token entropy.
        target: the entropy aimed at.
        step: the change of alpha per call.
        lower: alpha's floor.
        upper: alpha's ceiling.
    """
    direction = (target > entropy) - (target < entropy)
    return float(min(max(coef + step * direction, lower), upper))


@dataclasses.dataclass(frozen=True)
class EntropyBonus:
    """The bonus's settings (the coefficient itself is the module's state, in its checkpoints).

    Args:
        coef: alpha at the start (fixed when `target` is None).
        target: H_target, the token entropy (nats) the adaptive coefficient steers to; None = fixed.
        step: delta, the coefficient's change per rollout.
        min_coef: the coefficient's lower bound.
        max_coef: the coefficient's upper bound.
    """

    coef: float = 0.0
    target: float | None = None
    step: float = 0.0
    min_coef: float = 0.0
    max_coef: float = math.inf

    def __post_init__(self) -> None:
        if not 0 <= self.min_coef <= self.coef <= self.max_coef or not self.step >= 0:
            raise ValueError(f"the entropy bonus needs 0 <= min_coef <= coef <= max_coef and step >= 0: {self}")
        if self.target is not None and not (self.target >= 0 and self.step > 0):
            raise ValueError(f"an adaptive entropy bonus needs target >= 0 and step > 0: {self}")

    def next_coef(self, coef: float, entropy: float) -> float:
        """The coefficient for the next rollout, after one whose entropy estimate was `entropy`."""
        if self.target is None:
            return coef
        return adaptive_entropy_coef(coef, entropy, self.target, self.step, self.min_coef, self.max_coef)
