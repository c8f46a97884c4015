"""Pairwise reward-model loss (Bradley-Terry), with the Llama 2 margin and an optional centring term."""

from __future__ import annotations

from typing import NamedTuple

import torch.nn.functional as F
from torch import Tensor


class RewardLossOutput(NamedTuple):
    loss: Tensor  # () the training loss (ranking term + centring term)
    accuracy: Tensor  # () fraction of pairs with r_c > r_r (ties count as wrong), detached
    chosen_mean: Tensor  # () mean r_c, detached
    rejected_mean: Tensor  # () mean r_r, detached
    margin_mean: Tensor  # () mean reward gap r_c - r_r (not the data margin), detached
    ranking_loss: Tensor  # () the Bradley-Terry term alone, detached
    center_loss: Tensor  # () mean((r_c + r_r)^2), detached (logged even when center_coef == 0)


def bradley_terry_loss(
    chosen_rewards: Tensor,
    rejected_rewards: Tensor,
    margin: Tensor | None = None,
    center_coef: float = 0.0,
) -> RewardLossOutput:
    """Bradley-Terry ranking loss on scalar rewards of (chosen, rejected) pairs.

        loss = mean_b[ -log sigmoid(r_c - r_r - m) ] + center_coef * mean_b[ (r_c + r_r)^2 ]

    The first term is the negative log-likelihood of the Bradley-Terry preference model
    p(y_c > y_r) = sigmoid(r_c - r_r) (Lambert, "A Little Bit of RLHF", reward modelling eq. 3;
    InstructGPT, Ouyang et al. 2022, eq. 1). With a margin it is the Llama 2 variant (Lambert
    eq. 5; Touvron et al. 2023, eq. 2): the chosen reward must beat the rejected one by m.
    The second term (Eisenstein et al. 2023, "Helping or Herding?") pulls the pair's reward sum
    towards 0; the Bradley-Terry term alone is invariant to a constant shift of all rewards.

    Args:
        chosen_rewards: (B,) r_c = r(x, y_c).
        rejected_rewards: (B,) r_r = r(x, y_r).
        margin: (B,) per-pair margin m (e.g. from rating differences); None: m = 0.
        center_coef: weight of the centring term.
    """
    if chosen_rewards.shape != rejected_rewards.shape:
        raise ValueError(
            f"shape mismatch: chosen {tuple(chosen_rewards.shape)} vs rejected {tuple(rejected_rewards.shape)}"
        )
    diff = chosen_rewards - rejected_rewards  # (B,)
    logits = diff if margin is None else diff - margin
    ranking = -F.logsigmoid(logits).mean()
    center = ((chosen_rewards + rejected_rewards) ** 2).mean()
    loss = ranking + center_coef * center if center_coef else ranking
    diff = diff.detach()
    return RewardLossOutput(
        loss=loss,
        accuracy=(diff > 0).float().mean(),
        chosen_mean=chosen_rewards.detach().mean(),
        rejected_mean=rejected_rewards.detach().mean(),
        margin_mean=diff.mean(),
        ranking_loss=ranking.detach(),
        center_loss=center.detach(),
    )
