"""Listwise losses: the Plackett-Luce likelihood of a ranking of K completions, for a reward model
trained on rankings and for listwise DPO (Rafailov et al. 2023, App. A.3)."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor


class ListwiseLossOutput(NamedTuple):
    loss: Tensor  # () mean over lists of the Plackett-Luce negative log-likelihood
    utilities: Tensor  # (B, K) the scores the ranking was judged on (rewards), detached
    accuracy: Tensor  # () fraction of ranked pairs (i above j) with u_i > u_j (ties wrong), detached
    top1: Tensor  # () fraction of lists whose top-ranked completion has the strictly highest utility, detached
    losses: Tensor  # (B,) per-list negative log-likelihood, detached


def rank_by_scores(scores: Tensor) -> Tensor:
    """(B, K) long: each list's completion indices, best first, by descending `scores` (B, K).

    Ties keep the data's order (a stable sort): of two equal scores the earlier completion ranks
    higher.

    Args:
        scores: (B, K) each list's completion scores (higher is better).
    """
    return torch.sort(scores, dim=-1, descending=True, stable=True).indices


def plackett_luce_loss(utilities: Tensor, ranking: Tensor) -> ListwiseLossOutput:
    """Negative log-likelihood of rankings under the Plackett-Luce model.

    With sigma the ranking (sigma(1) the best), the probability of the order is

        P(sigma | u) = prod_{k=1}^{K} exp(u_{sigma(k)}) / sum_{j=k}^{K} exp(u_{sigma(j)})

    and the loss is `mean_b -log P(sigma_b | u_b) = mean_b sum_k [logsumexp_{j>=k} u_{sigma(j)} -
    u_{sigma(k)}]` (Plackett 1975; Luce 1959). For K = 2 it is Bradley-Terry's
    `-log sigmoid(u_chosen - u_rejected)`: the K-wise comparisons of a reward model trained on
    rankings (InstructGPT, Ouyang et al. 2022, Sec. 3.5, take the K(K-1)/2 pairs instead; this is
    the likelihood of the whole order). Equal utilities give `log K!` per list.

    Args:
        utilities: (B, K) a score per completion (a reward model's reward, or listwise DPO's
            implicit reward); list b's completions in the data's order.
        ranking: (B, K) long, a permutation of 0..K-1 per list, best first (`rank_by_scores`).
    """
    if utilities.dim() != 2 or ranking.shape != utilities.shape:
        raise ValueError(f"utilities and ranking must both be (B, K), got {tuple(utilities.shape)} and "
                         f"{tuple(ranking.shape)}")
    ordered = utilities.gather(-1, ranking)  # (B, K) best first
    tails = ordered.flip(-1).logcumsumexp(-1).flip(-1)  # (B, K): logsumexp over ranks k..K
    losses = (tails - ordered).sum(-1)  # (B,)
    ordered = ordered.detach()
    above = torch.ones(ordered.shape[-1], ordered.shape[-1], dtype=torch.bool, device=ordered.device).triu(1)
    right = (ordered[:, :, None] > ordered[:, None, :])[:, above]  # (B, K(K-1)/2) pairs i ranked above j
    return ListwiseLossOutput(
        loss=losses.mean(),
        utilities=utilities.detach(),
        accuracy=right.float().mean(),
        top1=(ordered[:, :1] > ordered[:, 1:]).all(-1).float().mean(),
        losses=losses.detach(),
    )


def listwise_dpo_loss(policy_logps: Tensor, ref_logps: Tensor, ranking: Tensor, beta: float) -> ListwiseLossOutput:
    """Listwise DPO (Rafailov et al. 2023, App. A.3): Plackett-Luce over the implicit rewards.

        u_k = beta * (log pi(y_k | x) - log pi_ref(y_k | x)),   loss = plackett_luce_loss(u, ranking)

    For K = 2 it is DPO's sigmoid loss (`dpo_loss`). `utilities` in the output are the implicit
    rewards u.

    Args:
        policy_logps: (B, K) sequence log-probs of each list's completions under the policy.
        ref_logps: (B, K) the same under the frozen reference.
        ranking: (B, K) long, completion indices best first (`rank_by_scores`).
        beta: KL strength, as DPO's.
    """
    return plackett_luce_loss(beta * (policy_logps - ref_logps), ranking)
