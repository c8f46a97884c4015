import math

import pytest
import torch

from lit_rlhf.losses import log_odds, orpo_loss
from lit_rlhf.losses.orpo import log1mexp

# Two pairs of length-normalised probabilities P = exp(mean log-prob):
#   pair 0: P(y_c) = 0.5 (odds 1, log odds 0), P(y_r) = 0.2 (odds 1/4): log OR = log 4
#   pair 1: the same two completions, swapped: log OR = -log 4
CHOSEN = torch.log(torch.tensor([0.5, 0.2]))
REJECTED = torch.log(torch.tensor([0.2, 0.5]))


def test_log_odds_by_hand():
    assert log_odds(torch.log(torch.tensor([0.5, 0.2, 0.8]))).tolist() == pytest.approx(
        [0.0, -math.log(4), math.log(4)], abs=1e-6)


def test_log1mexp_is_accurate_near_zero_and_far_below():
    x = torch.tensor([-1e-6, -0.5, -1.0, -40.0], dtype=torch.float64)
    expected = [math.log(-math.expm1(v)) for v in x.tolist()]
    assert log1mexp(x).tolist() == pytest.approx(expected, rel=1e-12)
    x = torch.tensor([-1e-6, -40.0], requires_grad=True)
    log1mexp(x).sum().backward()
    assert torch.isfinite(x.grad).all()  # d/dx log(1 - e^x) = -e^x / (1 - e^x)
    assert x.grad.tolist() == pytest.approx([-1 / 1e-6, -math.exp(-40)], rel=1e-3)


def test_orpo_loss_by_hand():
    # pair 0: NLL = -log 0.5 = 0.6931472, L_OR = -log sigmoid(log 4) = log(1 + 1/4) = 0.2231436
    # pair 1: NLL = -log 0.2 = 1.6094379, L_OR = -log sigmoid(-log 4) = log(1 + 4) = 1.6094379
    # lambda = 0.1: losses 0.7154615 and 1.7703817, mean 1.2429216
    out = orpo_loss(CHOSEN, REJECTED, odds_ratio_coef=0.1)
    assert out.losses.tolist() == pytest.approx([0.7154615, 1.7703817], abs=1e-6)
    assert out.loss.item() == pytest.approx(1.2429216, abs=1e-6)
    assert out.nll.item() == pytest.approx((math.log(2) + math.log(5)) / 2, abs=1e-6)
    assert out.odds_ratio_loss.item() == pytest.approx((math.log(1.25) + math.log(5)) / 2, abs=1e-6)
    assert out.log_odds_ratios.tolist() == pytest.approx([math.log(4), -math.log(4)], abs=1e-6)
    assert out.accuracies.item() == 0.5
    # lambda = 0: plain SFT on the chosen completions
    assert orpo_loss(CHOSEN, REJECTED, 0.0).loss.item() == pytest.approx(out.nll.item(), abs=1e-6)


def test_orpo_gradient_by_hand():
    # d log odds / d mean_logp = 1 / (1 - P); d L_OR / d log OR = -sigmoid(-log OR). Pair 0
    # (sigmoid(-log 4) = 1/5): chosen -1 + 0.1 * (-1/5) / (1 - 0.5) = -1.04, rejected
    # 0.1 * (1/5) / (1 - 0.2) = 0.025. Pair 1 (sigmoid(log 4) = 4/5): chosen
    # -1 + 0.1 * (-4/5) / (1 - 0.2) = -1.1, rejected 0.1 * (4/5) / (1 - 0.5) = 0.16. Mean: / 2.
    chosen, rejected = CHOSEN.clone().requires_grad_(True), REJECTED.clone().requires_grad_(True)
    out = orpo_loss(chosen, rejected, 0.1)
    out.loss.backward()
    assert chosen.grad.tolist() == pytest.approx([-0.52, -0.55], abs=1e-6)
    assert rejected.grad.tolist() == pytest.approx([0.0125, 0.08], abs=1e-6)
    assert not out.log_odds_ratios.requires_grad and not out.losses.requires_grad
