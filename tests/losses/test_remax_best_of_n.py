"""ReMax's advantage and the best-of-N / rejection-sampling functions, against values worked out
by hand (`lit_rlhf.losses.remax`, `lit_rlhf.losses.best_of_n`)."""

from __future__ import annotations

import math

import pytest
import torch

from lit_rlhf.losses import best_of_n_kl, nll_loss, rejection_sampling_mask, remax_advantages, rloo_loss


def test_remax_advantage_is_the_reward_minus_the_greedy_reward():
    # two prompts, two samples each: greedy rewards 0.5 (prompt 0) and -1 (prompt 1)
    rewards = torch.tensor([1.0, 0.25, -2.0, 0.0])
    greedy = torch.tensor([0.5, 0.5, -1.0, -1.0])
    assert remax_advantages(rewards, greedy).tolist() == [0.5, -0.25, -1.0, 1.0]
    with pytest.raises(ValueError, match="shape"):
        remax_advantages(rewards, greedy[:2])


def test_remax_gradient_by_hand():
    """With rloo_loss: grad of -1/N sum_i A_i * sum_t logp_it w.r.t. logp_it is -A_i/N on kept tokens."""
    logps = torch.tensor([[-1.0, -2.0], [-0.5, -0.5]], requires_grad=True)
    mask = torch.tensor([[True, True], [True, False]])
    adv = remax_advantages(torch.tensor([2.0, 0.0]), torch.tensor([1.0, 1.0]))  # [1, -1]
    loss = rloo_loss(logps, adv, mask)
    assert loss.item() == pytest.approx(-(1 * -3.0 + -1 * -0.5) / 2)  # 1.25
    loss.backward()
    assert logps.grad.tolist() == [[-0.5, -0.5], [0.5, 0.0]]


@pytest.mark.parametrize("n, expected", [(1, 0.0), (2, math.log(2) - 0.5), (4, math.log(4) - 0.75),
                                         (16, math.log(16) - 15 / 16)])
def test_best_of_n_kl_closed_form(n, expected):
    assert best_of_n_kl(n) == pytest.approx(expected)


def test_best_of_n_kl_matches_the_exact_kl_of_best_of_n_on_a_uniform_policy():
    """A policy uniform over M responses with distinct rewards: the best of n has probability
    P(rank k is the best) = (k^n - (k-1)^n) / M^n for the k-th lowest; its KL to the uniform
    policy tends to log n - (n-1)/n as M grows (Beirami et al. 2024: an upper bound)."""
    m, n = 20000, 4
    k = torch.arange(1, m + 1, dtype=torch.float64)
    p = (k.pow(n) - (k - 1).pow(n)) / m ** n
    kl = float((p * (p * m).log()).sum())
    assert kl <= best_of_n_kl(n) and kl == pytest.approx(best_of_n_kl(n), abs=1e-3)
    with pytest.raises(ValueError):
        best_of_n_kl(0)


def test_rejection_sampling_mask_per_prompt_and_top_k():
    scores = torch.tensor([0.1, 0.9, 0.5, 0.7, 0.7, 0.2])  # 2 prompts x 3 samples
    assert rejection_sampling_mask(scores, 3).tolist() == [False, True, False, True, False, False]  # first max on a tie
    assert rejection_sampling_mask(scores, 3, "top_k", 3).tolist() == [False, True, False, True, True, False]
    assert rejection_sampling_mask(scores, 3, "top_k", 2).tolist() == [False, True, False, True, False, False]
    with pytest.raises(ValueError, match="top_k"):
        rejection_sampling_mask(scores, 3, "top_k", 7)
    with pytest.raises(ValueError, match="groups of 4"):
        rejection_sampling_mask(scores, 4)


def test_nll_loss_is_the_token_mean():
    logps = torch.tensor([[-1.0, -3.0, -9.0], [-2.0, -9.0, -9.0]], requires_grad=True)
    mask = torch.tensor([[True, True, False], [True, False, False]])
    loss = nll_loss(logps, mask)
    assert loss.item() == pytest.approx(2.0)  # (1 + 3 + 2) / 3
    loss.backward()
    assert logps.grad[mask].tolist() == pytest.approx([-1 / 3] * 3) and logps.grad[~mask].abs().sum() == 0
