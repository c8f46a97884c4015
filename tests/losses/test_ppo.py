import math

import pytest
import torch

from lit_rlhf.losses import ppo_policy_loss, ppo_rewards, ppo_value_loss

LN = math.log


def _close(actual: torch.Tensor, expected) -> None:
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=actual.dtype), atol=1e-6, rtol=0)


def test_ppo_policy_loss_by_hand():
    # one row, eps = 0.2; token 4 is padding (huge ratio and advantage that must not count)
    #   t  ratio  A   -A*ratio  -A*clip(ratio)  max    clipped term larger?
    #   0  1.0    1   -1.0      -1.0            -1.0   no
    #   1  1.5    1   -1.5      -1.2            -1.2   yes
    #   2  0.5   -1    0.5       0.8             0.8   yes
    #   3  0.5    1   -0.5      -0.8            -0.5   no  (pessimistic bound keeps the unclipped term)
    # loss = (-1 - 1.2 + 0.8 - 0.5) / 4 = -0.475; clipfrac = 2/4
    old = torch.zeros(1, 5)
    logps = torch.tensor([[0.0, LN(1.5), LN(0.5), LN(0.5), LN(3.0)]], requires_grad=True)
    adv = torch.tensor([[1.0, 1.0, -1.0, 1.0, 5.0]])
    mask = torch.tensor([[True, True, True, True, False]])
    out = ppo_policy_loss(logps, old, adv, mask, clip_eps=0.2)
    assert out.loss.item() == pytest.approx(-0.475, abs=1e-6)
    assert out.clipfrac.item() == pytest.approx(0.5)
    # approxkl = 0.5 * mean(logratio^2) = 0.5 * (0 + ln1.5^2 + 2 ln0.5^2) / 4
    assert out.approxkl.item() == pytest.approx(0.5 * (LN(1.5) ** 2 + 2 * LN(0.5) ** 2) / 4, abs=1e-6)
    # ratios [1, 1.5, 0.5, 0.5]: mean 0.875, biased var (0.125^2 + 0.625^2 + 2 * 0.375^2) / 4 = 0.171875
    assert out.ratio_mean.item() == pytest.approx(0.875)
    assert out.ratio_var.item() == pytest.approx(0.171875)
    # gradient: clipped tokens 0; d(-A ratio)/d logp = -A ratio -> t0: -1/4, t3: -0.5/4; padding 0
    out.loss.backward()
    _close(logps.grad, [[-0.25, 0.0, 0.0, -0.125, 0.0]])


def test_ppo_first_ratio_is_one():
    gen = torch.Generator().manual_seed(0)
    logps = torch.randn(3, 6, generator=gen)
    adv = torch.randn(3, 6, generator=gen)
    mask = torch.tensor([[True] * 6, [True] * 3 + [False] * 3, [True] + [False] * 5])
    out = ppo_policy_loss(logps, logps.clone(), adv, mask)
    # ratio == 1 exactly: loss = -mean of the kept advantages, nothing clipped, no KL
    assert out.loss.item() == pytest.approx(-(adv[mask].mean().item()), abs=1e-6)
    assert out.clipfrac.item() == 0.0
    assert out.approxkl.item() == 0.0
    assert out.ratio_mean.item() == 1.0
    assert out.ratio_var.item() == 0.0


def test_ppo_value_loss_by_hand():
    # eps = 0.2, token 3 is padding
    #   t  v    old  ret  v_clip                    (v-ret)^2  (v_clip-ret)^2  max   clipped larger?
    #   0  1.0  1.0  2.0  1.0                       1.0        1.0             1.0   no (equal)
    #   1  1.5  1.0  1.0  1.0 + clip(0.5) = 1.2     0.25       0.04            0.25  no
    #   2  0.0  0.5  0.0  0.5 + clip(-0.5) = 0.3    0.0        0.09            0.09  yes
    # loss = 0.5 * (1 + 0.25 + 0.09) / 3 = 0.2233333; clipfrac 1/3
    values = torch.tensor([[1.0, 1.5, 0.0, 2.0]], requires_grad=True)
    old = torch.tensor([[1.0, 1.0, 0.5, 0.0]])
    returns = torch.tensor([[2.0, 1.0, 0.0, 5.0]])
    mask = torch.tensor([[True, True, True, False]])
    out = ppo_value_loss(values, old, returns, mask, clip_eps=0.2)
    assert out.loss.item() == pytest.approx(0.5 * 1.34 / 3, abs=1e-6)
    assert out.clipfrac.item() == pytest.approx(1 / 3)
    assert out.vpred.item() == pytest.approx(2.5 / 3)
    assert out.error.item() == pytest.approx(1.25 / 3)
    # gradient: t1 unclipped 0.5 * 2 * (1.5 - 1) / 3 = 1/6; t2 takes the clipped term, saturated -> 0;
    # t0: both terms equal 1 with slope 2 * (1 - 2) = -2 (torch.maximum splits a tie) -> 0.5 * -2 / 3
    out.loss.backward()
    _close(values.grad, [[-1 / 3, 1 / 6, 0.0, 0.0]])


def test_ppo_rewards_score_at_last_response_token():
    # k1 kl = logps - ref: row 0 [0.5, -1, 0, (pad)], row 1 [0.5, 0, (pad), (pad)]; kl_coef 0.1
    # rewards = -0.1 * kl, plus score 2.0 at row 0 index 2 and -1.0 at row 1 index 1
    logps = torch.tensor([[-1.0, -2.0, -1.0, 0.0], [-0.5, -1.0, 0.0, 0.0]])
    ref = torch.tensor([[-1.5, -1.0, -1.0, -9.0], [-1.0, -1.0, -3.0, 0.0]])
    mask = torch.tensor([[True, True, True, False], [True, True, False, False]])
    out = ppo_rewards(torch.tensor([2.0, -1.0]), logps, ref, mask, kl_coef=0.1)
    _close(out.kl, [[0.5, -1.0, 0.0, 0.0], [0.5, 0.0, 0.0, 0.0]])
    _close(out.rewards, [[-0.05, 0.1, 2.0, 0.0], [-0.05, -1.0, 0.0, 0.0]])
    # with k3: kl(0.5) = e^-0.5 - 1 + 0.5 = 0.1065307, kl(-1) = e - 1 - 1 = 0.7182818
    out3 = ppo_rewards(torch.tensor([2.0, -1.0]), logps, ref, mask, kl_coef=0.1, estimator="k3")
    assert out3.kl[0, :2].tolist() == pytest.approx([0.1065307, 0.7182818], abs=1e-6)
    assert out3.rewards[0, 2].item() == pytest.approx(2.0)
    assert out3.kl[0, 3].item() == 0.0


def test_ppo_padding_garbage_gives_finite_gradients():
    logps = torch.tensor([[-1.0, 0.0]], requires_grad=True)
    old = torch.tensor([[-1.0, -1000.0]])  # padding log-ratio 1000: exp overflows if not masked first
    out = ppo_policy_loss(logps, old, torch.tensor([[2.0, 1.0]]), torch.tensor([[True, False]]))
    out.loss.backward()
    assert out.loss.item() == -2.0
    _close(logps.grad, [[-2.0, 0.0]])
