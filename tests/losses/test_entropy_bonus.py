import math

import pytest
import torch

from lit_rlhf.losses.entropy_bonus import (
    EntropyBonus,
    adaptive_entropy_coef,
    entropy_bonus_penalty,
    sampled_entropy,
)


def test_penalty_has_the_score_function_gradient_of_the_entropy():
    logps = torch.tensor([[-0.5, -2.0], [-1.0, -3.0]], requires_grad=True)
    mask = torch.tensor([[True, True], [True, False]])
    penalty = entropy_bonus_penalty(logps, mask, 0.1)
    assert torch.allclose(penalty, torch.tensor([[0.025, 0.4], [0.1, 0.0]]))  # 0.1 * lp^2 in value
    penalty.sum().backward()
    assert torch.allclose(logps.grad, torch.tensor([[-0.05, -0.2], [-0.1, 0.0]]))  # 0.1 * lp
    assert sampled_entropy(logps, mask).item() == pytest.approx((0.5 + 2.0 + 1.0) / 3)


def test_the_score_function_gradient_matches_the_exact_entropy_gradient():
    # a 3-way softmax: E_y[grad of b(y)] over y ~ pi equals -grad H exactly
    z = torch.tensor([0.3, -1.0, 0.8], requires_grad=True)
    logp = torch.log_softmax(z, 0)
    expected = -torch.autograd.grad(-(logp.exp() * logp).sum(), z)[0]
    by_tokens = sum(logp[y].exp().detach() * torch.autograd.grad(
        entropy_bonus_penalty(torch.log_softmax(z, 0)[y].view(1, 1), torch.ones(1, 1, dtype=torch.bool), 1.0).sum(),
        z)[0] for y in range(3))
    assert torch.allclose(by_tokens, expected, atol=1e-6)


def test_adaptive_coefficient():
    assert adaptive_entropy_coef(0.01, 0.1, 0.2, 0.005, 0.0, 0.02) == pytest.approx(0.015)  # below target: up
    assert adaptive_entropy_coef(0.01, 0.3, 0.2, 0.005, 0.0, 0.02) == pytest.approx(0.005)  # above: down
    assert adaptive_entropy_coef(0.01, 0.2, 0.2, 0.005, 0.0, 0.02) == 0.01  # at the target: unchanged
    assert adaptive_entropy_coef(0.018, 0.1, 0.2, 0.005, 0.0, 0.02) == 0.02  # clipped above
    assert adaptive_entropy_coef(0.002, 0.3, 0.2, 0.005, 0.0, 0.02) == 0.0  # and below
    assert EntropyBonus(coef=0.01).next_coef(0.01, 5.0) == 0.01  # fixed
    assert EntropyBonus(0.01, 0.2, 0.005, 0.0, 0.02).next_coef(0.01, 0.1) == pytest.approx(0.015)
    for bad in (dict(coef=-1.0), dict(coef=0.5, max_coef=0.1), dict(target=0.2), dict(step=-1.0)):
        with pytest.raises(ValueError, match="entropy bonus"):
            EntropyBonus(**bad)
    assert math.isinf(EntropyBonus().max_coef)
