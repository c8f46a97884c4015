"""Clip-Cov and KL-Cov (Cui et al. 2025), by hand.

logps [[-1, -4], [-2, -1]] (mean -2), advantages per row [3, -1] (token mean 1):
Cov = [[(1)(2), (-2)(2)], [(0)(-2), (1)(-2)]] = [[2, -4], [0, -2]].
"""

import pytest
import torch

from lit_rlhf.losses.entropy_cov import clip_cov_keep, kl_cov_penalty, kl_cov_selected, token_covariance

LOGPS = torch.tensor([[-1.0, -4.0], [-2.0, -1.0]])
ADV = torch.tensor([3.0, -1.0])
MASK = torch.ones(2, 2, dtype=torch.bool)
COV = torch.tensor([[2.0, -4.0], [0.0, -2.0]])


def test_token_covariance():
    assert torch.equal(token_covariance(LOGPS, ADV, MASK), COV)
    assert torch.equal(token_covariance(LOGPS, ADV.unsqueeze(1).expand(2, 2), MASK), COV)
    # a padded token is left out of both means and gets 0: means over the 3 kept tokens -7/3 and 5/3
    mask = torch.tensor([[True, True], [True, False]])
    cov = token_covariance(LOGPS, ADV, mask)
    expected = [[(-1 + 7 / 3) * (3 - 5 / 3), (-4 + 7 / 3) * (3 - 5 / 3)], [(-2 + 7 / 3) * (-1 - 5 / 3), 0.0]]
    assert torch.allclose(cov, torch.tensor(expected))


def test_clip_cov_detaches_the_tokens_in_the_band():
    # only (0, 0) has 1 < Cov < 5; max(1, floor(2e-4 * 4)) = 1 token
    assert clip_cov_keep(COV, MASK).tolist() == [[False, True], [True, True]]
    assert clip_cov_keep(COV, MASK, ratio=1.0).tolist() == [[False, True], [True, True]]  # fewer candidates than 4
    assert torch.equal(clip_cov_keep(COV, MASK, exclude=torch.tensor([[True, False], [False, False]])), MASK)
    assert clip_cov_keep(COV, MASK, lower=-5.0, upper=-3.0).tolist() == [[True, False], [True, True]]
    # two candidates (Cov 2 and 0 in (-1, 3)), one drawn: which one is the generator's
    keeps = {tuple(clip_cov_keep(COV, MASK, lower=-1.0, upper=3.0, generator=torch.Generator().manual_seed(s))
                   .flatten().tolist()) for s in range(20)}
    assert keeps == {(False, True, True, True), (True, True, False, True)}
    with pytest.raises(ValueError, match="lower < upper"):
        clip_cov_keep(COV, MASK, lower=5.0, upper=1.0)


def test_kl_cov_penalises_the_largest_covariances():
    assert kl_cov_selected(COV, MASK).tolist() == [[True, False], [False, False]]
    assert kl_cov_selected(COV, MASK, ratio=0.5).tolist() == [[True, False], [True, False]]  # 2 and 0
    padded = torch.tensor([[False, True], [True, True]])
    assert kl_cov_selected(COV, padded, ratio=0.5).tolist() == [[False, False], [True, False]]  # floor(1.5) = 1
    logps = LOGPS.clone().requires_grad_(True)
    old = torch.tensor([[-1.5, -4.0], [-1.0, -1.0]])
    penalty = kl_cov_penalty(logps, old, kl_cov_selected(COV, MASK, ratio=0.5), coef=2.0)
    assert torch.allclose(penalty, torch.tensor([[1.0, 0.0], [2.0, 0.0]]))  # 2 * |0.5|, 2 * |-1|
    penalty.sum().backward()
    assert torch.equal(logps.grad, torch.tensor([[2.0, 0.0], [-2.0, 0.0]]))
    with pytest.raises(ValueError, match="ratio"):
        kl_cov_selected(COV, MASK, ratio=0.0)


def test_covariance_control_apply():
    from lit_rlhf.losses import CovarianceControl

    clip = CovarianceControl("clip_cov")
    weights, penalty = clip.apply(LOGPS, None, ADV, MASK, 0.2, 0.2)  # on-policy: nothing clipped by PPO
    assert penalty is None and weights.tolist() == [[0.0, 1.0], [1.0, 1.0]]
    # token (0, 0) at ratio e^0.5 = 1.65 > 1.2 with A = 3 > 0: the PPO clip already cut it, no candidate left
    old = LOGPS - torch.tensor([[0.5, 0.0], [0.0, 0.0]])
    weights, _ = clip.apply(LOGPS, old, ADV, MASK, 0.2, 0.2)
    assert weights.tolist() == [[1.0] * 2] * 2
    weights, penalty = CovarianceControl("kl_cov", ratio=0.25, kl_coef=2.0).apply(LOGPS, old, ADV, MASK, 0.2, 0.2)
    assert weights is None and torch.allclose(penalty, torch.tensor([[1.0, 0.0], [0.0, 0.0]]))
