"""GSPO: GRPO with one length-normalised importance ratio per sequence, clipped per sequence."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from lit_rlhf.losses import GRPOLossOutput, gspo_policy_loss
from lit_rlhf.modules.grpo import GRPOModule


class GSPOModule(GRPOModule):
    """GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization", Eq. 5-7).

    `GRPOModule` whose `policy_loss` is `losses.gspo_policy_loss`: the importance ratio of a
    response is the geometric mean of its tokens' ratios,

        s_i = (pi(y_i|x) / pi_old(y_i|x)) ^ (1/|y_i|) = exp(mean_t (log pi - log pi_old)),

    clipped per sequence, l_i = -min(s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i), and the
    loss is the mean over sequences (`aggregation` pinned to `sequence_mean`: micro-batches weigh
    their share of rows). The advantages are GRPO's group-normalised ones (`scale`). As s_i is a
    geometric mean its clip ranges are tiny: the paper's 3e-4 / 4e-4 are the defaults. Clip
    fractions count sequences.

    A rollout correction (the source's `correction`) weighs each sequence's term by the mean of
    its tokens' factors: at the `sequence` or `geometric` level (GSPO's own granularity) that is
    the sequence's weight, or 0 for a dropped sequence.

    Args:
        clip_eps_low: lower clip range of the sequence ratio (1 - eps_low; the paper's 3e-4).
        clip_eps_high: upper clip range of the sequence ratio (1 + eps_high; the paper's 4e-4).
        kl_coef: weight of the k3 KL to the reference added to the loss (the token mean of each
            sequence, then the mean over sequences), as in `GRPOModule`; 0 (the paper's Eq. 5 has
            no KL term) skips the reference model entirely.
        **kwargs: every `GRPOModule` argument but `aggregation` (num_generations, scale,
            num_iterations, num_minibatches, temperature), `OnlineModule` and `PolicyModule`.
    """

    takes_entropy_control = False  # one ratio per sequence

    def __init__(self, clip_eps_low: float = 3e-4, clip_eps_high: float = 4e-4, kl_coef: float = 0.0,
                 **kwargs: Any) -> None:
        super().__init__(clip_eps_low=clip_eps_low, clip_eps_high=clip_eps_high, kl_coef=kl_coef,
                         aggregation="sequence_mean", **kwargs)

    def policy_loss(self, logps: Tensor, old_logps: Tensor | None, ref_logps: Tensor | None, advantages: Tensor,
                    mask: Tensor, token_weights: Tensor | None) -> GRPOLossOutput:
        return gspo_policy_loss(logps, old_logps, ref_logps, advantages, mask, self.clip_eps_low, self.clip_eps_high,
                                self.kl_coef, token_weights)
