"""XPO: online DPO on pairs of a policy sample and a reference sample, plus an exploration term."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from lit_rlhf.losses import xpo_loss
from lit_rlhf.modules.online_dpo import OnlineDPOModule


class XPOModule(OnlineDPOModule):
    """Exploratory preference optimisation (Xie et al. 2024, "Exploratory Preference Optimization:
    Harnessing Implicit Q*-Approximation for Sample-Efficient RLHF", Algorithm 1) with the loss
    `lit_rlhf.losses.xpo_loss`.

    Each training step takes B prompts and:

    1. samples one response per prompt from the policy and one from the frozen reference, both
       through the rollout source (`sampled_models`: the reference's from `rollout.for_model
       ("reference")`, so from vLLM or the asynchronous producer when the policy's are, seeded and
       resumed alike); a prompt's rows are its policy response, then its reference response;
    2. the annotator scores both as in `OnlineDPOModule` (reward sources or a pairwise judge); the
       better-scored one is chosen, the other rejected; a tie is left out of the loss;
    3. one on-policy step on `xpo_loss(beta, alpha, loss_type)`: DPO on the annotated pairs plus
       alpha times the policy's mean log-prob of the reference's responses, at temperature 1.

    Logs `OnlineDPOModule`'s stats plus `loss/xpo`, `loss/exploration` and `pairs/policy_wins`
    (the share of annotated pairs the policy's response won).

    Args:
        alpha: the exploration coefficient (Xie et al.'s alpha; 1e-5 as TRL's default: the term
            is a sum of log-probs over a response's tokens, unbounded below).
        **kwargs: `OnlineDPOModule` (beta, loss_type, reward sources, reference, sampling, ...).
    """

    sampled_models = ("policy", "reference")

    def __init__(self, alpha: float = 1e-5, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not alpha >= 0:
            raise ValueError(f"alpha must be >= 0, got {alpha}")
        self.alpha = float(alpha)

    def pair_loss(self, policy: Tensor, reference: Tensor, logps: Tensor,
                  first_wins: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        """`xpo_loss`: DPO on (chosen, rejected) plus alpha times the policy's log-prob of each
        pair's second row, the reference's sample."""
        out = xpo_loss(policy[:, 0], policy[:, 1], reference[:, 0], reference[:, 1], logps[:, 1], self.beta,
                       self.alpha, self.loss_type)
        dpo = out.dpo
        return out.loss, {"loss/xpo": out.loss.detach(), "loss/dpo": dpo.loss, "loss/exploration": out.exploration,
                          "rewards/chosen": dpo.chosen_rewards.mean(), "rewards/rejected": dpo.rejected_rewards.mean(),
                          "rewards/margins": dpo.margins.mean(), "rewards/accuracies": dpo.accuracies,
                          "pairs/policy_wins": first_wins.float().mean()}
