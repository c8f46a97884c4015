"""KTO: Kahneman-Tversky Optimisation on unpaired desirable / undesirable completions."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor


class KTOLossOutput(NamedTuple):
    loss: Tensor  # () mean over the batch of the per-example losses
    rewards: Tensor  # (B,) beta * (log pi - log pi_ref), detached
    desirable_rewards: Tensor  # () mean reward of the desirable examples (0 when there are none), detached
    undesirable_rewards: Tensor  # () mean reward of the undesirable examples (0 when none), detached
    num_desirable: Tensor  # () long
    num_undesirable: Tensor  # () long
    kl: Tensor  # () the reference point z0 actually used (detached, >= 0)
    losses: Tensor  # (B,) per-example losses (0 for unlabelled rows), detached
    num_unlabelled: Tensor  # () long, rows left out of the loss (`labelled` False)


def kto_loss(
    policy_logps: Tensor,
    ref_logps: Tensor,
    desirable: Tensor,
    kl: Tensor | float,
    beta: float,
    desirable_weight: float = 1.0,
    undesirable_weight: float = 1.0,
    labelled: Tensor | None = None,
) -> KTOLossOutput:
    """KTO loss (Ethayarajh et al. 2024, Sec. 4, "Kahneman-Tversky Optimization").

    With r = log pi(y|x) - log pi_ref(y|x) and the reference point z0 = max(kl, 0), detached
    (the paper neither backpropagates through z0 nor lets it go negative):

        desirable:   lambda_D * (1 - sigmoid(beta * (r - z0)))
        undesirable: lambda_U * (1 - sigmoid(beta * (z0 - r)))

    i.e. lambda_y - v(x, y) of the paper, averaged over the labelled rows of both classes together
    (lambda_D, lambda_U correct an imbalance: `kto_weight_ratio`). Unlabelled rows are left out of
    the sum and the count; none labelled gives an attached loss of 0.

    Args:
        policy_logps: (B,) sequence log-probs of the completions under the policy.
        ref_logps: (B,) the same under the reference.
        desirable: (B,) bool, True = desirable.
        kl: scalar estimate of KL(pi || pi_ref) (`kto_kl_estimate`).
        beta: the KL strength, > 0.
        desirable_weight: lambda_D.
        undesirable_weight: lambda_U.
        labelled: (B,) bool, True = the row is in the loss; None: every row.
    """
    desirable = desirable.bool()
    labelled = torch.ones_like(desirable) if labelled is None else labelled.bool()
    z0 = torch.as_tensor(kl, dtype=policy_logps.dtype, device=policy_logps.device).detach().clamp(min=0)
    logratios = policy_logps - ref_logps  # (B,)
    desirable_losses = desirable_weight * (1.0 - torch.sigmoid(beta * (logratios - z0)))
    undesirable_losses = undesirable_weight * (1.0 - torch.sigmoid(beta * (z0 - logratios)))
    losses = torch.where(desirable, desirable_losses, undesirable_losses)  # (B,)
    losses = torch.where(labelled, losses, losses * 0.0)  # unlabelled rows: 0, and no gradient
    rewards = beta * logratios.detach()
    is_desirable, is_undesirable = desirable & labelled, ~desirable & labelled
    num_desirable, num_undesirable = is_desirable.sum(), is_undesirable.sum()
    num_labelled = labelled.sum()
    zero = rewards.new_zeros(())
    return KTOLossOutput(
        loss=losses.sum() / num_labelled.clamp(min=1),
        rewards=rewards,
        desirable_rewards=torch.where(is_desirable, rewards, zero).sum() / num_desirable.clamp(min=1),
        undesirable_rewards=torch.where(is_undesirable, rewards, zero).sum() / num_undesirable.clamp(min=1),
        num_desirable=num_desirable,
        num_undesirable=num_undesirable,
        kl=z0,
        losses=losses.detach(),
        num_unlabelled=(~labelled).sum(),
    )


def kto_kl_estimate(policy_mismatched_logps: Tensor, ref_mismatched_logps: Tensor, clamp: bool = True) -> Tensor:
    """The KTO reference point z0 from one micro-batch: mean log-ratio on mismatched pairs, >= 0.

    The completions are paired with the *wrong* prompts (y_j with x_i, x_j != x_i): a biased but
    cheap estimate of KL(pi || pi_ref) (Ethayarajh et al. 2024, Sec. 4), detached. The raw mean
    (`clamp=False`, logged beside z0) is not a KL, the completions being the dataset's: 0 while
    pi == pi_ref (D7), negative when training lowered their likelihood under unrelated prompts,
    where the clamp makes z0 = 0 (the paper's choice).

    Args:
        policy_mismatched_logps: (B,) policy log-probs of completions paired with the wrong prompts.
        ref_mismatched_logps: (B,) the same under the reference.
        clamp: clamp the estimate at 0 (z0); False: the raw mean log-ratio.
    """
    raw = (policy_mismatched_logps - ref_mismatched_logps).detach().mean()
    return raw.clamp(min=0) if clamp else raw


class RewardLabels(NamedTuple):
    desirable: Tensor  # (B,) bool, reward above the batch mean
    tied: Tensor  # (B,) bool, reward equal to the batch mean: no label (neither side)

    @property
    def labelled(self) -> Tensor:
        """(B,) bool: the rows with a side, desirable or undesirable."""
        return ~self.tied


def labels_from_rewards(rewards: Tensor) -> RewardLabels:
    """KTO labels from scalar rewards, relative to the batch mean: desirable above it,
    undesirable below it, and no label when equal to it.

    As the DRO paper's KTO baseline (Richemond et al. 2024; `docs/ARCHITECTURE.md` section 2). A
    tie (discrete rewards: an all-equal batch) is no evidence for either side: `tied` rows are left
    out of the loss (`kto_loss(labelled=...)`) and counted. The comparison is exact, B * r_i
    against sum_j r_j in float64 (a float mean of B copies of 0.1 need not equal 0.1).

    Args:
        rewards: (B,) one scalar reward per row.
    """
    wide = rewards.detach().double()
    scaled, total = wide * wide.numel(), wide.sum()
    return RewardLabels(desirable=scaled > total, tied=scaled == total)


KTO_WEIGHT_RATIO_RANGE = (1.0, 4.0 / 3.0)  # Ethayarajh et al. 2024, Sec. 4.2 (Eq. 9)


def kto_weight_ratio(num_desirable: Tensor | float, num_undesirable: Tensor | float, desirable_weight: float,
                     undesirable_weight: float) -> float:
    """lambda_D n_D / (lambda_U n_U): how much the desirable examples weigh against the undesirable
    ones. The KTO paper (Sec. 4.2) recommends keeping it in [1, 4/3]; `inf` with no undesirable
    example (or lambda_U = 0), `nan` when both sides weigh 0.

    Args:
        num_desirable: n_D, the desirable examples.
        num_undesirable: n_U, the undesirable examples.
        desirable_weight: lambda_D.
        undesirable_weight: lambda_U.
    """
    desirable = desirable_weight * float(num_desirable)
    undesirable = undesirable_weight * float(num_undesirable)
    if undesirable == 0:
        return float("nan") if desirable == 0 else float("inf")
    return desirable / undesirable
