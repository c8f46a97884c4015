"""ORPO: the chosen completion's NLL plus a log odds-ratio penalty, no reference model (Hong et al.
2024, "ORPO: Monolithic Preference Optimization without Reference Model")."""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

_LOG_HALF = -math.log(2.0)


class ORPOLossOutput(NamedTuple):
    loss: Tensor  # () mean over pairs of NLL(y_c) + lambda * L_OR
    nll: Tensor  # () mean NLL of the chosen completions, per token (eq. 2), detached
    odds_ratio_loss: Tensor  # () mean of L_OR = -log sigmoid(log OR), detached
    log_odds_ratios: Tensor  # (B,) log odds(y_c) - log odds(y_r), detached
    accuracies: Tensor  # () fraction of pairs with log OR > 0, detached
    losses: Tensor  # (B,) per-pair NLL + lambda * L_OR, detached


def log1mexp(x: Tensor) -> Tensor:
    """log(1 - exp(x)) for x <= 0, accurate on both sides of log(1/2) (Maechler 2012): log(-expm1(x))
    near 0, log1p(-exp(x)) below. Each branch sees only inputs where it is accurate, so neither
    puts a NaN into the gradient."""
    near_zero = x > _LOG_HALF
    upper = torch.log(-torch.expm1(torch.where(near_zero, x, torch.full_like(x, _LOG_HALF))))
    lower = torch.log1p(-torch.exp(torch.where(near_zero, torch.full_like(x, _LOG_HALF), x)))
    return torch.where(near_zero, upper, lower)


def log_odds(mean_logps: Tensor) -> Tensor:
    """log odds(y|x) = log P - log(1 - P) of the length-normalised probability
    P = exp((1/|y|) sum_t log pi(y_t|x, y_<t)) (ORPO eq. 4). (B,) -> (B,).

    Args:
        mean_logps: (B,) length-normalised sequence log-probs.
    """
    return mean_logps - log1mexp(mean_logps)


def orpo_loss(chosen_mean_logps: Tensor, rejected_mean_logps: Tensor, odds_ratio_coef: float) -> ORPOLossOutput:
    """ORPO's loss `mean_b [L_SFT + lambda * L_OR]` (Hong et al. 2024, eq. 6), no reference model.
    With P(y|x) = exp(length-normalised log-prob) and `odds(y|x) = P / (1 - P)` (eq. 4):

        L_SFT = -(1/|y_c|) log pi(y_c|x) = -chosen_mean_logps           (eq. 2)
        log OR = log odds(y_c|x) - log odds(y_r|x)                      (eq. 5)
        L_OR  = -log sigmoid(log OR)                                     (eq. 7)

    Args:
        chosen_mean_logps: (B,) length-normalised log-probs of the chosen completions under the policy.
        rejected_mean_logps: (B,) the same for the rejected completions.
        odds_ratio_coef: the paper's lambda, weight of L_OR (0.1 in its experiments).
    """
    log_or = log_odds(chosen_mean_logps) - log_odds(rejected_mean_logps)  # (B,)
    ratio_losses = -F.logsigmoid(log_or)  # (B,)
    nll = -chosen_mean_logps  # (B,)
    losses = nll + odds_ratio_coef * ratio_losses  # (B,)
    return ORPOLossOutput(
        loss=losses.mean(),
        nll=nll.detach().mean(),
        odds_ratio_loss=ratio_losses.detach().mean(),
        log_odds_ratios=log_or.detach(),
        accuracies=(log_or.detach() > 0).float().mean(),
        losses=losses.detach(),
    )
