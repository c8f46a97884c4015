"""GSPO's sequence-level loss (Zheng et al. 2025, Eq. 5-7) against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from lit_rlhf.losses.gspo import gspo_policy_loss

log = math.log


def test_gspo_sequence_ratio_and_sequence_clipping():
    mask = torch.tensor([[True, True], [True, False]])
    logps = torch.tensor([[log(0.5), log(0.25)], [log(0.8), -3.0]], requires_grad=True)
    old = torch.tensor([[log(0.25), log(0.25)], [log(0.4), -1.0]])  # the masked -3 vs -1 must not count
    adv = torch.tensor([1.0, -1.0])
    out = gspo_policy_loss(logps, old, None, adv, mask, clip_eps_low=0.2, clip_eps_high=0.2)
    # s_1 = exp(mean(log 2, 0)) = sqrt 2 (clipped to 1.2, A > 0); s_2 = exp(log 2) = 2 (A < 0: min keeps -2)
    assert out.loss.item() == pytest.approx((-1.2 + 2.0) / 2)
    assert out.ratio_mean.item() == pytest.approx((math.sqrt(2) + 2) / 2)
    assert out.clipfrac_high.item() == 0.5 and out.clipfrac_low.item() == 0.0
    out.loss.backward()
    # sequence 1 is clipped: no gradient; l_2 = s_2 = exp(logp - old) -> d loss / d logp[1,0] = s_2 / 2 = 1
    assert logps.grad[0].abs().sum().item() == 0.0
    assert logps.grad[1, 0].item() == pytest.approx(1.0) and logps.grad[1, 1].item() == 0.0


def test_gspo_on_policy_is_the_sequence_mean_of_minus_advantages():
    logps = torch.randn(3, 4)
    mask = torch.ones(3, 4, dtype=torch.bool)
    out = gspo_policy_loss(logps, None, None, torch.tensor([1.0, 2.0, -0.5]), mask)
    assert out.loss.item() == pytest.approx(-(1.0 + 2.0 - 0.5) / 3)
