"""REINFORCE++: the KL in the per-token reward, per-token advantages normalised over the batch."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from lit_rlhf.distributed import gather_rows
from lit_rlhf.losses import GRPOLossOutput, clipped_token_loss, normalize_token_advantages, reinforce_pp_advantages
from lit_rlhf.modules.grpo import GRPOModule
from lit_rlhf.types import Rollout


class ReinforcePPModule(GRPOModule):
    """REINFORCE++, a critic-free PPO with the KL in the per-token reward (Hu et al. 2025,
    "REINFORCE++: A Simple and Efficient Approach for Aligning Large Language Models", arXiv
    2501.03262): the KL to the reference is a penalty in the reward, not a term of the loss.

    `GRPOModule` with two steps replaced:

    - `advantages`: per TOKEN, A_t = r - kl_coef * sum_{i >= t} (log pi_old - log pi_ref)(y_i),
      the outcome reward minus the k1 KL still to come (gamma 1; `losses.reinforce_pp_advantages`),
      then normalised over every kept token of the GLOBAL batch, all ranks
      (`losses.normalize_token_advantages`). With `baseline` each group's mean reward is first
      subtracted from r (REINFORCE++ with baseline);
    - `policy_loss`: PPO's clipped surrogate per token on those advantages, token mean
      (`losses.clipped_token_loss`); with `tis_cap` the truncated importance weights multiply the
      advantages. There is no KL term in the loss.

    GRPO's `scale`, `eps` and `aggregation` are pinned to what REINFORCE++ does: the batch
    (normalisation over the global batch, eps 1e-8) and the token mean.

    Args:
        baseline: subtract each group's mean reward from the reward before the KL penalty
            (REINFORCE++ with baseline); False: the raw reward.
        kl_coef: weight of the k1 KL to the reference subtracted from the per-token reward (its
            sum over the tokens still to come), never added to the loss; 0 skips the reference
            model entirely. Adapted by `KLControlCallback` when it is used.
        **kwargs: every `GRPOModule` argument but `scale` and `aggregation`
            (num_generations, clip_eps_low, clip_eps_high, num_iterations, num_minibatches,
            temperature), `OnlineModule` and `PolicyModule`.
    """

    eps = 1e-8
    takes_entropy_control = False  # `clipped_token_loss` (GRPO's clipped loss per token, no entropy control)

    def __init__(self, baseline: bool = False, kl_coef: float = 0.01, **kwargs: Any) -> None:
        super().__init__(scale="batch", aggregation="token_mean", kl_coef=kl_coef, **kwargs)
        self.baseline = bool(baseline)

    @property
    def needs_rollout_logps(self) -> bool:
        # the KL in the reward reads the sampling-time log-probs
        return super().needs_rollout_logps or self.kl_coef > 0

    def advantages(self, rollout: Rollout) -> Tensor:
        mask = rollout.loss_mask  # (N, R)
        token_advantages = reinforce_pp_advantages(
            rollout.scores.float(), mask, rollout.logps, rollout.ref_logps, self.kl_coef,
            self.num_generations if self.baseline else None,
        )  # (N, R)
        (everyone, own), (everyone_mask, _) = gather_rows(token_advantages), gather_rows(mask)
        return normalize_token_advantages(everyone, everyone_mask, self.eps)[own]  # (N, R)

    def policy_loss(self, logps: Tensor, old_logps: Tensor | None, ref_logps: Tensor | None, advantages: Tensor,
                    mask: Tensor, token_weights: Tensor | None) -> GRPOLossOutput:
        weighted = advantages if token_weights is None else advantages * token_weights
        return clipped_token_loss(logps, old_logps, weighted, mask, self.clip_eps_low, self.clip_eps_high)
