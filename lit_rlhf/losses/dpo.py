"""Direct preference losses: DPO, SLiC hinge, IPO and GPO's exponential and Savage losses as one
family f(beta * h); XPO, DPO plus an exploration term."""

from __future__ import annotations

from typing import Literal, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

DPOLossType = Literal["sigmoid", "hinge", "ipo", "exponential", "savage"]
DPO_LOSS_TYPES: tuple[str, ...] = ("sigmoid", "hinge", "ipo", "exponential", "savage")


class DPOLossOutput(NamedTuple):
    loss: Tensor  # () mean over pairs of f(z)
    chosen_rewards: Tensor  # (B,) beta * (log pi - log pi_ref)(y_c), detached
    rejected_rewards: Tensor  # (B,) beta * (log pi - log pi_ref)(y_r), detached
    margins: Tensor  # (B,) chosen_rewards - rejected_rewards = z, detached
    accuracies: Tensor  # () fraction of pairs with chosen_reward > rejected_reward, detached
    losses: Tensor  # (B,) per-pair f(z), detached


def dpo_loss(
    policy_chosen_logps: Tensor,
    policy_rejected_logps: Tensor,
    ref_chosen_logps: Tensor,
    ref_rejected_logps: Tensor,
    beta: float,
    loss_type: DPOLossType = "sigmoid",
) -> DPOLossOutput:
    """Pairwise direct-alignment loss `mean_b f(z_b)`, z = beta * h, with the log-ratio difference

        h = [log pi(y_c) - log pi_ref(y_c)] - [log pi(y_r) - log pi_ref(y_r)]

    `beta` is the KL strength for every `loss_type` (the implicit reward is beta * log(pi / pi_ref)):

    - "sigmoid" (DPO, Rafailov et al. 2023, eq. 7): f(z) = -log sigmoid(z)
    - "hinge" (SLiC-HF, Zhao et al. 2023, with the reference log-ratio as in RSO): max(0, 1 - z)
    - "ipo" (IPO, Azar et al. 2024, eq. 17): (2z - 1)^2 = 4 beta^2 * (h - 1/(2 beta))^2, the
      paper's per-pair loss times 4 beta^2: same minimiser, so an implementation of the unscaled
      form (TRL) needs a learning rate 1/(4 beta^2) larger to match. Pass length-normalised
      log-probs for the paper's token averages.
    - "exponential" (GPO, Tang et al. 2024, Sec. 2): exp(-z), minimised at half the DPO optimum
      and unbounded as z -> -inf.
    - "savage" (GPO's Savage loss, Masnadi-Shirazi & Vasconcelos 2008): sigmoid(-z)^2, bounded
      and not convex: a badly ranked (possibly mislabelled) pair's gradient vanishes.

    Args:
        policy_chosen_logps: (B,) sequence log-probs (sums over completion tokens) of the chosen
            y_c under the policy.
        policy_rejected_logps: (B,) the same for the rejected y_r.
        ref_chosen_logps: (B,) log pi_ref(y_c) under the frozen reference.
        ref_rejected_logps: (B,) log pi_ref(y_r).
        beta: KL strength, > 0; z = beta * h is the implicit reward margin.
        loss_type: the function f, one of `DPO_LOSS_TYPES` (above).
    """
    chosen_logratios = policy_chosen_logps - ref_chosen_logps  # (B,)
    rejected_logratios = policy_rejected_logps - ref_rejected_logps  # (B,)
    z = beta * (chosen_logratios - rejected_logratios)  # (B,)
    if loss_type == "sigmoid":
        losses = -F.logsigmoid(z)
    elif loss_type == "hinge":
        losses = F.relu(1.0 - z)
    elif loss_type == "ipo":
        losses = (2.0 * z - 1.0) ** 2
    elif loss_type == "exponential":
        losses = torch.exp(-z)
    elif loss_type == "savage":
        losses = torch.sigmoid(-z) ** 2
    else:
        raise ValueError(f"unknown loss_type {loss_type!r}; expected one of {', '.join(DPO_LOSS_TYPES)}")
    chosen_rewards = beta * chosen_logratios.detach()
    rejected_rewards = beta * rejected_logratios.detach()
    margins = chosen_rewards - rejected_rewards
    return DPOLossOutput(
        loss=losses.mean(),
        chosen_rewards=chosen_rewards,
        rejected_rewards=rejected_rewards,
        margins=margins,
        accuracies=(chosen_rewards > rejected_rewards).float().mean(),
        losses=losses.detach(),
    )


class XPOLossOutput(NamedTuple):
    loss: Tensor  # () the DPO term plus the exploration term
    dpo: DPOLossOutput  # the DPO term and its statistics (detached but its `loss`)
    exploration: Tensor  # () alpha * mean_b log pi(y~_b), detached


def xpo_loss(
    policy_chosen_logps: Tensor,
    policy_rejected_logps: Tensor,
    ref_chosen_logps: Tensor,
    ref_rejected_logps: Tensor,
    policy_ref_sample_logps: Tensor,
    beta: float,
    alpha: float,
    loss_type: DPOLossType = "sigmoid",
) -> XPOLossOutput:
    """Exploratory preference optimisation (XPO, Xie et al. 2024, Algorithm 1): DPO plus an
    exploration term on the reference's samples,

        L = mean_b f(beta * h_b) + alpha * mean_b log pi(y~_b | x_b),   y~_b ~ pi_ref(. | x_b)

    with f and h as `dpo_loss`'s. Each pair (y_c, y_r) is a policy sample y and a reference sample
    y~ of one prompt, ordered by the annotator. Minimising alpha * log pi(y~) lowers the policy's
    probability of what the reference already says, pushing it to explore outside the reference's
    support (the paper's optimism; alpha = 0 is online DPO).

    Args:
        policy_chosen_logps: (B,) the policy's sequence log-probs of each pair's chosen response.
        policy_rejected_logps: (B,) the policy's, of the rejected response.
        ref_chosen_logps: (B,) the reference's, of the chosen response (`dpo_loss`).
        ref_rejected_logps: (B,) the reference's, of the rejected response.
        policy_ref_sample_logps: (B,) the policy's sequence log-probs of the reference's samples y~.
        beta: DPO's beta (`dpo_loss`).
        alpha: the exploration coefficient (>= 0).
        loss_type: `dpo_loss`'s f.
    """
    dpo = dpo_loss(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps, beta, loss_type)
    exploration = alpha * policy_ref_sample_logps.mean()
    return XPOLossOutput(dpo.loss + exploration, dpo._replace(loss=dpo.loss.detach()), exploration.detach())
